"""The scheduler's hot modules run compiled (setup.py, mypyc), and a source checkout whose compiled copies are
older than their sources, which Python would otherwise run in their place, runs the sources and warns."""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import os
import subprocess
import sys
import warnings
from pathlib import Path

from datamgr.scheduler.compiled import run_sources_if_stale, stale_sources

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
    """A checkout (setup.py beside the package) whose package `pkg` holds mod.py and a compiled copy of it, each
    last modified the given number of seconds ago. The copy is an empty file, which Python cannot load: a test
    that imports `pkg.mod` succeeds only if the source was taken. `pkg/__init__.py` checks as
    `datamgr.scheduler` does."""
    (tmp_path / "setup.py").write_text("")
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from pathlib import Path\n"
        "from datamgr.scheduler.compiled import run_sources_if_stale\n"
        "run_sources_if_stale(Path(__file__).parents[1], __name__, Path(__file__).parent)\n"
    )
    now = os.stat(tmp_path).st_mtime
    for name, text, age in (("mod.py", "VALUE = 'from source'\n", source_age), (f"mod{EXTENSION}", "", compiled_age)):
        (package / name).write_text(text)
        os.utime(package / name, (now - age, now - age))
    (package / f"shared__mypyc{EXTENSION}").write_text("")  # no source of its own: never stale
    return package


def import_in_fresh_interpreter(checkout: Path, code: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(ROOT)])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, cwd=checkout)


def test_a_source_edited_after_its_compiled_copy_was_built_runs_from_source_with_a_warning_naming_it(
    tmp_path: Path,
) -> None:
    package = checkout_with_module(tmp_path, source_age=10.0, compiled_age=60.0)
    assert stale_sources(package) == [package / "mod.py"]

    ran = import_in_fresh_interpreter(tmp_path, "import pkg.mod; print(pkg.mod.VALUE, pkg.mod.__file__)")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["from", "source", str(package / "mod.py")]
    assert ran.stderr.count("StaleCompiledModules") == 1
    assert "pkg/mod.py changed after" in ran.stderr and "make setup" in ran.stderr


def test_a_compiled_copy_built_after_its_source_is_the_one_imported(tmp_path: Path) -> None:
    package = checkout_with_module(tmp_path, source_age=60.0, compiled_age=10.0)
    assert stale_sources(package) == []

    ran = import_in_fresh_interpreter(tmp_path, "import pkg.mod")

    assert ran.returncode != 0 and f"mod{EXTENSION}" in ran.stderr  # Python took the (unloadable) copy
    assert "StaleCompiledModules" not in ran.stderr


def test_an_installed_package_is_not_checked(tmp_path: Path) -> None:
    # Installed from a wheel, file times say nothing about the build: only a checkout (with setup.py) is checked.
    package = checkout_with_module(tmp_path, source_age=10.0, compiled_age=60.0)
    (tmp_path / "setup.py").unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_sources_if_stale(tmp_path, "pkg", package) is False
