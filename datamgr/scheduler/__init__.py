"""Scheduling policies that turn jobs and cluster resources into cache and remote IO allocations.

Its hot modules are compiled when silod is installed (setup.py); in a source checkout, importing the package
refuses compiled copies older than their sources (`compiled.py`).
"""

from pathlib import Path

from datamgr.scheduler.compiled import check_source_checkout

check_source_checkout(Path(__file__).resolve().parents[2], Path(__file__).resolve().parent)
