"""Suite-wide test policy: fail on unexpected warnings from our own code, and every test module in one tier.

Tiers, by what a module's tests need at most (select with `-m`; `make test-fast` runs the first two):
- `unit`: in-process code on temporary files;
- `fuse_ops`: the FUSE operations driven directly, without a kernel mount;
- `process`: daemons, servers (the data manager, moto, Azurite) or commands as processes, no FUSE mount;
- `mount`: real FUSE mounts, usually with the processes above;
- `external`: needs a tool that neither Debian's registry nor PyPI has (kubectl 1.21+): not in `make test`,
  run by `make test-external` where the tool is installed.

`make test` runs the modules in pytest-xdist worker processes (Makefile: `TEST_WORKERS`, `--dist loadfile`): a
module's tests run in one worker, in order, and a session fixture (Azurite, moto) starts once per worker, so
nothing may assume it is the only test running on the machine (free ports and temporary paths only).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

pytest_plugins = (
    "tests.storage_servers",
    "tests.datamgr_fixtures",
    "tests.mount_fixtures",
    "tests.disks",
    "tests.cache_fixtures",
    "tests.launcher",
    "tests.cluster_fixtures",
)

OUR_LOGGERS = ("silod", "datamgr", "fuseclient", "silodcli", "silodlib")


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


TIERS: dict[str, tuple[str, ...]] = {
    "unit": (
        "test_access", "test_backend_uris", "test_backoff", "test_baselines", "test_compiled", "test_deploy_model",
        "test_fitgpp", "test_fitgpp_sim", "test_hived", "test_hived_policy",
        "test_greedy", "test_journal", "test_layout", "test_lifecycle", "test_manager", "test_manifest", "test_perf",
        "test_node_agents", "test_failure_log", "test_fuse_refusals",
        "test_policies", "test_policy_conformance", "test_registry", "test_sim_cli", "test_sim_engine",
        "test_sim_floor", "test_sim_inputs", "test_sim_internals", "test_sim_preemption",
        "test_scrub", "test_sim_report", "test_sim_sweep", "test_snapshot", "test_state", "test_store", "test_throttle",
        "test_tenant_report", "test_tenant_trace", "test_tiresias", "test_units",
        "test_tenant_storage", "test_read_deadline", "test_azure_options",
        "test_tenant_storage_sim",
        "test_harmony", "test_colocation_sim", "test_colocation_inputs", "test_colocation_storage", "test_loader_waves",
    ),
    "fuse_ops": ("test_fs_ops",),
    "process": (
        "test_backends", "test_cache", "test_cache_durability", "test_cli", "test_cli_startup", "test_concurrency",
        "test_config",
        "test_cli_input",
        "test_datamgr_rpc", "test_dataset_options", "test_demo", "test_deploy", "test_deploy_security",
        "test_devservers", "test_launcher",
        "test_liveness",
        "test_logs", "test_stored_options",
        "test_backend_option_values", "test_azure_token_endpoint",
        "test_mount_cli", "test_registration", "test_restart", "test_retry", "test_status_watch", "test_watch",
        "test_tenants_cli", "test_tenants_live",
    ),
    "external": ("test_deploy_kubectl",),
    "mount": (
        "test_agent", "test_backend_faults", "test_cache_disk_faults", "test_cache_permissions", "test_controller",
        "test_controller_live", "test_agent_churn", "test_agent_stop",
        "test_datamgr_faults", "test_failed_read_memo",
        "test_estimator_live", "test_log_fields", "test_metrics", "test_mount", "test_node_registration",
        "test_option_rotation", "test_hanging_opens",
        "test_rate_change",
        "test_readahead", "test_security",
        "test_unservable_datasets",
    ),
}  # fmt: skip
TIER_OF = {module: tier for tier, modules in TIERS.items() for module in modules}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its module's tier; a module in no tier fails collection, so none is left out."""
    for item in items:
        module = item.path.stem
        if module not in TIER_OF:
            raise pytest.UsageError(f"tests/{module}.py is in no tier: add it to TIERS in tests/conftest.py")
        item.add_marker(getattr(pytest.mark, TIER_OF[module]))
