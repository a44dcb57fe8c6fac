"""Guarding a source checkout against compiled modules older than their sources.

Installing silod compiles the simulator's and the policies' hot modules to C with mypyc (`setup.py`), and
Python then imports a module's compiled copy (`engine.cpython-311-x86_64-linux-gnu.so`) in place of its
source. In a source checkout (an editable install, where the copies sit beside the sources) a source edited
or checked out after the last build would silently not run. So importing `datamgr.scheduler` from a
checkout refuses compiled copies older than their sources, naming them and how to rebuild. Installed
packages are not checked: their sources cannot drift from their build, and their file times say nothing.
"""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

REBUILD_HINT = (
    "rebuild them with `make setup` (or `.venv/bin/python setup.py build_ext --inplace`), or delete the "
    "compiled copies (`find datamgr -name '*.so' -delete`) to run from source"
)


class StaleCompiledModule(ImportError):
    """A compiled module in a source checkout is older than its source."""


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


def check_source_checkout(checkout: Path, package_dir: Path) -> None:
    """Raise `StaleCompiledModule` if `checkout` is a source checkout (it has a `setup.py`) whose
    `package_dir` holds compiled copies older than their sources."""
    if not (checkout / "setup.py").is_file():
        return
    stale = stale_sources(package_dir)
    if stale:
        names = ", ".join(str(source.relative_to(checkout)) for source in stale)
        raise StaleCompiledModule(
            f"{names} changed after the compiled copies Python runs instead were built: {REBUILD_HINT}"
        )
