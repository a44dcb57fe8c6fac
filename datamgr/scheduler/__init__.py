"""Scheduling policies that turn jobs and cluster resources into cache and remote IO allocations.

Its hot modules are compiled when silod is installed (setup.py); in a source checkout whose compiled copies
are older than their sources, importing the package runs the sources instead and warns (`compiled.py`).
"""

from pathlib import Path

from datamgr.scheduler.compiled import run_sources_if_stale

run_sources_if_stale(Path(__file__).resolve().parents[2], __name__, Path(__file__).resolve().parent)
