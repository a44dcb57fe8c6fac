"""Suite-wide test policy: fail on unexpected warnings from our own code."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = ("tests.storage_servers", "tests.datamgr_fixtures", "tests.mount_fixtures", "tests.disks")

OUR_LOGGERS = ("silod", "datamgr", "fuseclient")


@pytest.fixture(autouse=True)
def _no_unexpected_warnings(caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest) -> Iterator[None]:
    """A WARNING or worse from silod code fails the test unless the test is marked `expected_warnings`."""
    caplog.set_level(logging.INFO)
    yield
    if request.node.get_closest_marker("expected_warnings"):
        return
    loud = [
        r for r in caplog.get_records("call") if r.levelno >= logging.WARNING and r.name.split(".")[0] in OUR_LOGGERS
    ]
    assert not loud, "unexpected warnings: " + "; ".join(f"{r.name}: {r.getMessage()}" for r in loud)
