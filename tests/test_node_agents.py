"""Which node agent serves each node (`datamgr.node_agents`): the one whose watch stream is open for it. Another
agent with the same node id is refused while that stream is open, and takes the node once it has ended; an agent
from before agent ids (an empty id) is never refused and holds nothing."""

from __future__ import annotations

import calendar
import logging

import pytest

from datamgr.entities import FailedPrecondition
from datamgr.node_agents import Holder, NodeAgents, NodeServedElsewhere

START = calendar.timegm((2026, 11, 27, 10, 30, 5, 0, 0, 0))  # 2026-11-27T10:30:05Z


class FakeWallClock:
    def __init__(self) -> None:
        self.now = float(START)

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeWallClock:
    return FakeWallClock()


@pytest.fixture
def agents(clock: FakeWallClock) -> NodeAgents:
    return NodeAgents(clock)


def test_a_node_without_an_open_stream_is_served_by_no_agent_and_refused_to_none(agents: NodeAgents) -> None:
    assert agents.holder("n1") is None
    agents.check("n1", "agent-a")
    agents.check("n1", "agent-b")
    agents.check("n1", "")


@pytest.mark.expected_warnings  # the refusal's warning (see the last test)
def test_another_agent_is_refused_while_one_streams_naming_the_node_its_peer_and_since_when(
    agents: NodeAgents, clock: FakeWallClock
) -> None:
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:43122"):
        clock.now += 100
        agents.check("n1", "agent-a")  # its own calls are its own
        with pytest.raises(NodeServedElsewhere) as refused:
            agents.check("n1", "agent-b")
        agents.check("n2", "agent-b")  # other nodes are not held

    assert isinstance(refused.value, FailedPrecondition)
    assert str(refused.value) == (
        "node_id: node 'n1' is served by another node agent, at ipv4:10.0.0.5:43122 since 2026-11-27T10:30:05Z "
        "(agent agent-a): give each agent its own --node-id, or stop the other agent first"
    )
    assert refused.value.holder == Holder("agent-a", "ipv4:10.0.0.5:43122", START, 1)


@pytest.mark.expected_warnings  # the refusal's warning (see the last test)
def test_a_refused_stream_changes_nothing_and_another_agent_takes_the_node_once_the_stream_ends(
    agents: NodeAgents, clock: FakeWallClock
) -> None:
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:1"):
        clock.now += 10
        with pytest.raises(NodeServedElsewhere), agents.streaming("n1", "agent-b", "ipv4:10.0.0.6:1"):
            pytest.fail("the other agent's stream was let through")
        assert agents.holder("n1") == Holder("agent-a", "ipv4:10.0.0.5:1", START, 1)

    assert agents.holder("n1") is None
    clock.now += 10
    with agents.streaming("n1", "agent-b", "ipv4:10.0.0.6:1"):
        assert agents.holder("n1") == Holder("agent-b", "ipv4:10.0.0.6:1", START + 20, 1)
        with pytest.raises(NodeServedElsewhere):
            agents.check("n1", "agent-a")


@pytest.mark.expected_warnings  # the refusal's warning (see the last test)
def test_streams_of_one_agent_are_one_hold_that_ends_with_the_last_and_shows_the_newest_peer(
    agents: NodeAgents, clock: FakeWallClock
) -> None:
    """A reconnect racing the end of the agent's old stream (a half-open connection the keepalive has not ended
    yet) is the same agent: accepted, and the node is held until both have ended."""
    old = agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:1")
    old.__enter__()
    clock.now += 30
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:2"):
        assert agents.holder("n1") == Holder("agent-a", "ipv4:10.0.0.5:2", START, 2)
        old.__exit__(None, None, None)  # the old connection's stream ends first
        assert agents.holder("n1") == Holder("agent-a", "ipv4:10.0.0.5:2", START, 1)
        with pytest.raises(NodeServedElsewhere):
            agents.check("n1", "agent-b")
    assert agents.holder("n1") is None


def test_a_stream_ended_by_an_error_ends_its_hold(agents: NodeAgents) -> None:
    with pytest.raises(ConnectionResetError), agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:1"):
        raise ConnectionResetError  # the stream cancelled, or its connection lost
    assert agents.holder("n1") is None
    agents.check("n1", "agent-b")


def test_an_agent_without_an_id_is_never_refused_and_holds_nothing(agents: NodeAgents) -> None:
    """An agent from before agent ids sends none: it cannot tell its calls from another agent's, so it conflicts
    with none, either way."""
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:1"):
        agents.check("n1", "")
        with agents.streaming("n1", "", "ipv4:10.0.0.7:1"):
            assert agents.holder("n1") == Holder("agent-a", "ipv4:10.0.0.5:1", START, 1)
    with agents.streaming("n1", "", "ipv4:10.0.0.7:1"):
        assert agents.holder("n1") is None
        agents.check("n1", "agent-b")
        with agents.streaming("n1", "agent-b", "ipv4:10.0.0.6:1"):
            assert agents.holder("n1") == Holder("agent-b", "ipv4:10.0.0.6:1", START, 1)


@pytest.mark.expected_warnings
def test_the_first_refusal_of_each_other_agent_in_a_hold_is_logged_as_a_warning_naming_both_agents(
    agents: NodeAgents, caplog: pytest.LogCaptureFixture
) -> None:
    """The refused agent retries with backoff and logs its own refusals; the data manager's operator learns of
    the clash from one warning per other agent and hold, not one per retry."""
    caplog.set_level(logging.DEBUG, logger="datamgr.node_agents")
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:1"):
        for _ in range(3):
            with pytest.raises(NodeServedElsewhere):
                agents.check("n1", "agent-b", "ipv4:10.0.0.6:7")
        with pytest.raises(NodeServedElsewhere):
            agents.check("n1", "agent-c")
    with agents.streaming("n1", "agent-a", "ipv4:10.0.0.5:2"), pytest.raises(NodeServedElsewhere):
        agents.check("n1", "agent-b", "ipv4:10.0.0.6:8")  # a new hold: logged again

    records = [(r.levelno, r.getMessage()) for r in caplog.records]
    warning, debug = logging.WARNING, logging.DEBUG
    assert [level for level, _ in records] == [warning, debug, debug, warning, warning]
    assert records[0][1].startswith(
        "refused node agent agent-b at ipv4:10.0.0.6:7 for node n1: node_id: node 'n1' is served by another node "
        "agent, at ipv4:10.0.0.5:1 since 2026-11-27T10:30:05Z (agent agent-a)"
    )
    assert records[3][1].startswith("refused node agent agent-c for node n1: ")
    assert records[4][1].startswith("refused node agent agent-b at ipv4:10.0.0.6:8 for node n1: ")
    assert all(r.node_id == "n1" for r in caplog.records)  # type: ignore[attr-defined]
