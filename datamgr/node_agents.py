"""Which node agent serves each node: the one whose allocation watch stream is open for it.

Two `silod node` processes started with the same --node-id would both mount the node's jobs, each reading the
node's remote IO rate, and overwrite each other's usage reports. So every agent process sends a random agent id
with its calls, and while one agent's watch stream is open for a node, a registration, watch or usage report for
that node from another agent is refused (`NodeServedElsewhere`, FAILED_PRECONDITION).

This is soft state, in memory only, like liveness: a restarted data manager holds no streams, and the agents'
reconnects take their nodes again. No timer ends a hold: the server's keepalive ends the stream of an agent that
was killed, stopped or cut off, and with its last stream its hold. Several streams of one agent (a reconnect that
races the end of its old stream) are one hold. An empty agent id, from an agent older than agent ids, is never
refused and holds nothing against others.

The data manager logs the first refusal of each other agent during a hold as a warning (the refused agent
retries with backoff and logs its own refusals; the operator who runs the data manager learns of the clash
here), and the agent serving a node is shown with the node (`GetNode`, `silod status`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from datamgr.entities import FailedPrecondition

log = logging.getLogger(__name__)

SERVED_ELSEWHERE = "node-served-by-another-agent"  # its `refusal` tag (`DataManagerError.refusal`)


@dataclass(frozen=True, slots=True)
class Holder:
    """The agent that serves a node: its id, the gRPC peer of its newest open stream, when its hold began (wall
    clock, seconds since the epoch) and how many streams it has open."""

    agent_id: str
    peer: str
    since: float
    streams: int


class NodeServedElsewhere(FailedPrecondition):
    """A call for a node from an agent other than the one serving it; nothing was changed."""

    refusal = SERVED_ELSEWHERE

    def __init__(self, node_id: str, holder: Holder) -> None:
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(holder.since))
        super().__init__(
            f"node_id: node {node_id!r} is served by another node agent, at {holder.peer or 'an unknown address'} "
            f"since {since} (agent {holder.agent_id}): give each agent its own --node-id, or stop the other agent "
            "first"
        )
        self.node_id = node_id
        self.holder = holder


@dataclass(slots=True)
class _Hold:
    agent_id: str
    since: float
    peers: dict[int, str] = field(default_factory=dict)  # by stream, oldest first
    refused: set[str] = field(default_factory=set)  # the other agents refused during this hold, logged once each

    def holder(self) -> Holder:
        return Holder(self.agent_id, next(reversed(self.peers.values())), self.since, len(self.peers))


class NodeAgents:
    """Per node, the agent whose watch streams are open for it; `wall_clock` dates a hold's start."""

    def __init__(self, wall_clock: Callable[[], float] = time.time) -> None:
        self._wall_clock = wall_clock
        self._holds: dict[str, _Hold] = {}
        self._streams = itertools.count()

    def holder(self, node_id: str) -> Holder | None:
        hold = self._holds.get(node_id)
        return None if hold is None else hold.holder()

    def check(self, node_id: str, agent_id: str, peer: str = "") -> None:
        """Raise NodeServedElsewhere if another agent (calling from gRPC `peer`) serves the node; an empty
        `agent_id` never conflicts."""
        hold = self._holds.get(node_id)
        if agent_id and hold is not None and hold.agent_id != agent_id:
            refusal = NodeServedElsewhere(node_id, hold.holder())
            first = agent_id not in hold.refused
            hold.refused.add(agent_id)
            log.log(
                logging.WARNING if first else logging.DEBUG,
                "refused node agent %s%s for node %s: %s",
                agent_id,
                f" at {peer}" if peer else "",
                node_id,
                refusal,
                extra={"node_id": node_id},
            )
            raise refusal

    @contextmanager
    def streaming(self, node_id: str, agent_id: str, peer: str) -> Iterator[None]:
        """Hold the node for `agent_id` while the block runs (its watch stream is open), or raise
        NodeServedElsewhere, changing nothing, if another agent holds it. The hold ends with the agent's last
        stream. An empty `agent_id` holds nothing."""
        self.check(node_id, agent_id, peer)
        if not agent_id:
            yield
            return
        hold = self._holds.setdefault(node_id, _Hold(agent_id, self._wall_clock()))
        stream = next(self._streams)
        hold.peers[stream] = peer
        try:
            yield
        finally:
            del hold.peers[stream]
            if not hold.peers:
                del self._holds[node_id]
