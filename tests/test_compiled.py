"""The scheduler's hot modules run compiled (setup.py, mypyc), and a source checkout refuses compiled copies
older than their sources, which Python would otherwise run in their place."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
from pathlib import Path

import pytest

from datamgr.scheduler.compiled import StaleCompiledModule, check_source_checkout, stale_sources

ROOT = Path(__file__).resolve().parents[1]
EXTENSION = importlib.machinery.EXTENSION_SUFFIXES[0]  # what a build for this interpreter names its copies


def compiled_modules() -> list[str]:
    """setup.py's COMPILED_MODULES, as module names (setup.py itself cannot be imported: it runs the build)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    listed = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMPILED_MODULES" for t in node.targets)
    )
    paths = ast.literal_eval(listed)
    return [path.removesuffix(".py").replace("/", ".") for path in paths]


def test_every_module_setup_compiles_is_imported_compiled() -> None:
    modules = compiled_modules()
    assert "datamgr.scheduler.sim.engine" in modules
    interpreted = [name for name in modules if not str(importlib.import_module(name).__file__).endswith(EXTENSION)]
    assert interpreted == [], "not compiled; `make setup` builds them"


def checkout_with_module(tmp_path: Path, source_age: float, compiled_age: float) -> Path:
    """A checkout (setup.py beside the package) whose package holds mod.py and a compiled copy of it, each
    last modified the given number of seconds ago."""
    (tmp_path / "setup.py").write_text("")
    package = tmp_path / "pkg"
    package.mkdir()
    now = os.stat(tmp_path).st_mtime
    for name, age in (("mod.py", source_age), (f"mod{EXTENSION}", compiled_age)):
        (package / name).write_text("")
        os.utime(package / name, (now - age, now - age))
    (package / f"shared__mypyc{EXTENSION}").write_text("")  # no source of its own: never stale
    return package


def test_a_source_edited_after_its_compiled_copy_was_built_is_refused_with_how_to_rebuild(tmp_path: Path) -> None:
    package = checkout_with_module(tmp_path, source_age=10.0, compiled_age=60.0)
    assert stale_sources(package) == [package / "mod.py"]
    with pytest.raises(StaleCompiledModule) as refused:
        check_source_checkout(tmp_path, package)
    assert "pkg/mod.py" in str(refused.value) and "make setup" in str(refused.value)


def test_a_compiled_copy_built_after_its_source_is_accepted(tmp_path: Path) -> None:
    package = checkout_with_module(tmp_path, source_age=60.0, compiled_age=10.0)
    assert stale_sources(package) == []
    check_source_checkout(tmp_path, package)


def test_an_installed_package_is_not_checked(tmp_path: Path) -> None:
    # Installed from a wheel, file times say nothing about the build: only a checkout (with setup.py) is checked.
    package = checkout_with_module(tmp_path, source_age=10.0, compiled_age=60.0)
    (tmp_path / "setup.py").unlink()
    check_source_checkout(tmp_path, package)
