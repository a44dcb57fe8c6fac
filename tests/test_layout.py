"""The packages import one way (docs/architecture.md): `silodcli` may import everything; `datamgr` and
`fuseclient` import `silodlib` and never each other or the command line; `silodlib` imports none of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "datamgr": {"fuseclient", "silodcli"},
    "fuseclient": {"datamgr", "silodcli"},
    "silodlib": {"datamgr", "fuseclient", "silodcli"},
}


def imported_packages(source: Path) -> set[str]:
    """The top-level packages a module imports, wherever in it the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source.read_text(), str(source))):
        if isinstance(node, ast.Import):
            found.update(alias.name.partition(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.partition(".")[0])
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_package_imports_only_the_packages_below_it(package: str) -> None:
    modules = sorted((REPO / package).rglob("*.py"))
    assert modules
    crossings = {
        str(module.relative_to(REPO)): sorted(imported_packages(module) & FORBIDDEN[package]) for module in modules
    }
    assert {module: found for module, found in crossings.items() if found} == {}
