"""Pure cluster-state logic: rate splitting, undo, and the per-node diffs that become watch events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from datamgr.entities import Dataset, Job, Node, NodeJobView, Worker
from datamgr.state import Change, ClusterState, DatasetRemoved, JobRemoved, diff_views

DATASET = Dataset("file:///data/a", {}, 1000, 10, 10, 4 << 20, "digest", 100)


@pytest.mark.parametrize(
    ("rate", "workers", "expected"),
    [
        (100, [("n1", 1), ("n2", 1)], {"n1": 50, "n2": 50}),
        (101, [("n1", 1), ("n2", 1)], {"n1": 51, "n2": 50}),
        (90, [("n1", 2), ("n2", 1)], {"n1": 60, "n2": 30}),
        (10, [("n1", 1), ("n2", 1), ("n3", 1)], {"n1": 4, "n2": 3, "n3": 3}),
        (0, [("n1", 4)], {"n1": 0}),
    ],
)
def test_node_rates_split_the_job_rate_per_worker_and_add_up_exactly(
    rate: int, workers: list[tuple[str, int]], expected: dict[str, int]
) -> None:
    job = Job("j", DATASET.uri, 1, tuple(Worker(n, c) for n, c in workers), rate)
    assert job.node_rates() == expected
    assert sum(job.node_rates().values()) == rate


def _state() -> ClusterState:
    nodes = [Node("n1", "h1:1", 10_000), Node("n2", "h2:1", 10_000)]
    job = Job("j1", DATASET.uri, 50, (Worker("n1", 1), Worker("n2", 1)), 40)
    return ClusterState(3, [DATASET], [job], nodes)


def test_apply_returns_an_undo_that_restores_every_index() -> None:
    state = _state()
    before = (dict(state.datasets), dict(state.jobs), dict(state.nodes), state.io_allocated_bytes_per_sec)
    change = Change(
        datasets_put=(replace(DATASET, cache_quota_bytes=7),),
        jobs_put=(Job("j2", DATASET.uri, 5, (Worker("n1", 1),), 30),),
        jobs_deleted=("j1",),
        nodes_put=(Node("n3", "h3:1", 5),),
    )
    undo = state.apply(change)
    assert state.io_allocated_bytes_per_sec == 30
    assert state.jobs_on_node("n2") == frozenset()
    assert state.nodes_mounting(DATASET.uri) == {"n1"}
    state.apply(undo)
    assert (
        dict(state.datasets),
        dict(state.jobs),
        dict(state.nodes),
        state.io_allocated_bytes_per_sec,
    ) == before
    assert state.jobs_on_node("n2") == {"j1"}
    assert state.nodes_mounting(DATASET.uri) == {"n1", "n2"}


def test_node_cache_allocated_counts_each_mounted_dataset_once() -> None:
    state = _state()
    state.apply(Change(jobs_put=(Job("j2", DATASET.uri, 5, (Worker("n1", 3),), 0),)))
    assert state.node_cache_allocated("n1") == 100


def test_diff_views_orders_datasets_before_jobs_and_removals_after() -> None:
    state = _state()
    empty = state.node_view("nobody")
    view = state.node_view("n1")
    assert diff_views(empty, view) == [DATASET, NodeJobView(state.jobs["j1"], 1, 20)]
    assert diff_views(view, empty) == [JobRemoved("j1"), DatasetRemoved(DATASET.uri)]
    assert diff_views(view, view) == []


def test_a_dataset_registered_again_with_other_parameters_names_each_difference_and_no_option_value() -> None:
    registered = Dataset("s3://b/p", {"region": "eu-west-1", "secret_access_key": "old-secret"}, 10, 1, 1, 4096, "d")
    assert registered.registration_differences(dict(registered.options), 4096) == []
    # No chunk size asked for (`silod dataset add` run again without --chunk-size): the one registered, whatever it is.
    assert registered.registration_differences(dict(registered.options), 0) == []
    asked = {"secret_access_key": "new-secret", "endpoint_url": "http://127.0.0.1:9"}
    assert registered.registration_differences(asked, 8192) == [
        "with chunk size 4096, not 8192",
        "without option 'endpoint_url'",
        "with option 'region'",
        "with another value of option 'secret_access_key'",
    ]
