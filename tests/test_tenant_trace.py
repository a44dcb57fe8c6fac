"""HiveD's multi-tenant traces: VCs in proportion to the paper's quotas, job sizes from its Table 2 cut to each
VC, each tenant's offered load, reproducibility, and the `hived-tenants` scenario."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from datamgr.scheduler.sim.fields import SimInputError
from datamgr.scheduler.sim.scenarios import _load, load_scenario
from datamgr.scheduler.sim.tenant_trace import (
    PAPER_TENANTS,
    TenantTraceConfig,
    _mean_duration,
    generate_tenant_trace,
    vc_nodes,
)


def test_vcs_follow_the_quotas_by_largest_remainder_with_a_node_each_at_least() -> None:
    cells = vc_nodes(PAPER_TENANTS, 50)
    assert sum(cells.values()) == 50 and min(cells.values()) == 1
    assert cells["res-f"] == 14 and cells["prod-e"] == 10 and cells["prod-a"] == 4  # 28.57 %, 19.78 %, 8.79 % of 50
    assert [cells[name] for name in ("res-a", "res-b", "res-c", "res-d", "res-e")] == [1, 1, 1, 1, 1]
    big = vc_nodes(PAPER_TENANTS, 279)  # the paper's cluster: every quota is a whole node or more
    assert sum(big.values()) == 279 and big["res-a"] == 1 and big["res-f"] == 80
    with pytest.raises(ValueError, match="10 nodes cannot give each of 11 tenants a node cell"):
        vc_nodes(PAPER_TENANTS, 10)


def test_job_sizes_follow_table_2_cut_to_the_tenants_vc() -> None:
    cells = vc_nodes(PAPER_TENANTS, 50)
    trace = generate_tenant_trace(TenantTraceConfig(4000, 3, 1.0), 8, cells)
    by_tenant: dict[str, list[int]] = {}
    for job in trace:
        by_tenant.setdefault(job.tenant, []).append(job.gpus)
    assert max(by_tenant["res-a"]) == 8  # its 40 jobs of >= 16 GPUs ask for its one node
    assert set(by_tenant["res-d"]) == {1}  # Table 2: res-d runs 1-GPU jobs only
    assert 16 in by_tenant["res-f"]
    prod_a = by_tenant["prod-a"]  # 1,132 of its 1,574 jobs are 8-GPU ones
    assert prod_a.count(8) / len(prod_a) == pytest.approx(1_132 / 1_574, abs=0.1)
    assert [job.arrival for job in trace] == sorted(job.arrival for job in trace)


def test_each_tenant_offers_its_vc_load_times_its_table_4_utilisation() -> None:
    cells = vc_nodes(PAPER_TENANTS, 50)
    config = TenantTraceConfig(20_000, 5, 2.0)
    trace = generate_tenant_trace(config, 8, cells)
    span = max(job.arrival for job in trace)
    for profile in PAPER_TENANTS:
        if cells[profile.name] < 5:
            continue  # too few jobs for a tight estimate
        work = sum(job.gpus * job.total_bytes / job.ideal_bytes_per_sec for job in trace if job.tenant == profile.name)
        offered = work / span / (cells[profile.name] * 8)
        assert offered == pytest.approx(config.load * profile.utilisation, rel=0.35), profile.name
    assert 3600 < _mean_duration() < 12 * 3600  # the generator's bands: about 8.7 hours


def test_a_tenants_jobs_do_not_change_when_another_tenants_profile_does() -> None:
    cells = vc_nodes(PAPER_TENANTS, 50)
    config = TenantTraceConfig(2000, 7, 1.0)
    changed = tuple(dataclasses.replace(p, utilisation=0.9) if p.name == "prod-e" else p for p in PAPER_TENANTS)
    before = [j for j in generate_tenant_trace(config, 8, cells) if j.tenant == "prod-a"]
    after = [j for j in generate_tenant_trace(config, 8, cells, changed) if j.tenant == "prod-a"]
    # The same sequence of jobs; the span they are drawn over follows the total rate, so one may run longer.
    common = min(len(before), len(after))
    assert common > 10
    assert [(j.arrival, j.gpus, j.epochs) for j in before[:common]] == [
        (j.arrival, j.gpus, j.epochs) for j in after[:common]
    ]
    assert generate_tenant_trace(config, 8, cells) == generate_tenant_trace(config, 8, cells)


def test_the_hived_tenants_scenario_shares_its_cluster_among_the_papers_tenants() -> None:
    scenario = load_scenario("hived-tenants")
    assert len(scenario.cluster.tenants) == 11 and scenario.cluster.cell_levels
    assert sum(share.cells["node"] for share in scenario.cluster.tenants.values()) == scenario.cluster.nodes
    assert {job.tenant for job in scenario.trace} == set(scenario.cluster.tenants)


def test_a_tenants_recipe_with_a_bad_key_is_refused(tmp_path: pytest.TempPathFactory) -> None:
    path = tmp_path / "bad.toml"  # type: ignore[operator]
    path.write_text(
        'description = "x"\n[cluster]\nnodes = 5\ngpus_per_node = 8\ncache_per_node = 0\nremote_io = "1GB/s"\n'
        '[generate]\nkind = "tenants"\njobs = 10\nseed = 1\nload = 1.0\nsharing = 0\n'
    )
    with pytest.raises(SimInputError, match="sharing"):
        _load("bad", path)
    path.write_text(path.read_text().replace("sharing = 0\n", ""))
    with pytest.raises(SimInputError, match="5 nodes cannot give each of 11 tenants a node cell"):
        _load("bad", path)


def test_a_cluster_with_tenants_reaches_compares_worker_processes() -> None:
    """`silod sim compare --jobs 2` pickles the cluster to its workers: the tenants' shares must survive it,
    compiled modules or not (a share compiled with snapshot.py could not be unpickled)."""
    cluster = load_scenario("hived-tenants").cluster
    assert pickle.loads(pickle.dumps(cluster)) == cluster
