"""Installing a site's package the way `pip install` leaves it: a module and its dist-info on a directory that
is on sys.path, so `importlib.metadata` finds its entry points (such as a `silod.policies` policy)."""

from __future__ import annotations

from pathlib import Path


def install_site_package(site: Path, name: str, module: str, source: str, entry_points: str) -> None:
    """Write `module`.py with `source` and the dist-info of distribution `name` declaring `entry_points`
    (the text of an entry_points.txt) into `site`."""
    (site / f"{module}.py").write_text(source)
    dist_info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(entry_points)
