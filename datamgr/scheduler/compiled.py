"""Running the sources in a checkout whose compiled modules are older than them, and saying so.

Installing silod compiles the simulator's and the policies' hot modules to C with mypyc (`setup.py`), and
Python then imports a module's compiled copy (`engine.cpython-311-x86_64-linux-gnu.so`) in place of its
source. In a source checkout (an editable install, where the copies sit beside the sources) a source edited
or checked out after the last build would silently not run. So importing `datamgr.scheduler` from a
checkout whose compiled copies are older than any of their sources imports every module of the package from
its source instead, and warns once, naming the edited sources and how to rebuild: an edit runs at once
(slower), never the stale build. All of them, not only the edited ones, because compiled modules call each
other natively: a fresh copy would still run the stale code of a module it calls. Installed packages are
not checked: their sources cannot drift from their build, and their file times say nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

REBUILD_HINT = "`make setup` (or `.venv/bin/python setup.py build_ext --inplace --force`) rebuilds them"


class StaleCompiledModules(RuntimeWarning):
    """A source checkout's compiled modules are older than their sources: the sources run instead."""


def stale_sources(package_dir: Path) -> list[Path]:
    """Sources under `package_dir` modified after their compiled copy was built."""
    suffixes = sorted(importlib.machinery.EXTENSION_SUFFIXES, key=len, reverse=True)  # the most specific first
    stale = []
    for compiled in sorted(package_dir.rglob("*.so")):
        suffix = next(s for s in suffixes if compiled.name.endswith(s))
        source = compiled.with_name(compiled.name.removesuffix(suffix) + ".py")
        if source.exists() and source.stat().st_mtime > compiled.stat().st_mtime:
            stale.append(source)
    return stale


class SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds the modules of one package in their `.py` files, ahead of the compiled copies beside them."""

    def __init__(self, package: str, package_dir: Path) -> None:
        self._prefix = package + "."
        self._dir = package_dir

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(self._prefix):
            return None
        source = self._dir.joinpath(*fullname.removeprefix(self._prefix).split(".")).with_suffix(".py")
        return importlib.util.spec_from_file_location(fullname, source) if source.is_file() else None


def run_sources_if_stale(checkout: Path, package: str, package_dir: Path) -> bool:
    """If `checkout` is a source checkout (it has a `setup.py`) whose `package_dir` holds compiled copies older
    than their sources, make `package`'s modules import from their sources and warn; True if it did."""
    if not (checkout / "setup.py").is_file():
        return False
    stale = stale_sources(package_dir)
    if not stale:
        return False
    sys.meta_path.insert(0, SourcesFirst(package, package_dir))
    names = ", ".join(str(source.relative_to(checkout)) for source in stale)
    warnings.warn(
        f"{names} changed after the compiled scheduler modules were built: running {package} from its sources "
        f"(slower) until {REBUILD_HINT}",
        StaleCompiledModules,
        stacklevel=2,
    )
    return True
