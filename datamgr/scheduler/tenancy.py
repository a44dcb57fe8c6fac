"""What a tenant is guaranteed: its share of the cluster, as policies see it in `Snapshot.tenants`.

A module of its own, and not compiled with `snapshot.py`: a simulated cluster carries its tenants' shares to
the worker processes of `silod sim compare`, and a frozen dataclass compiled by mypyc cannot be unpickled there
(its frozen `__setattr__` refuses the state being restored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class TenantShare:
    """What a tenant's virtual cluster guarantees it (HiveD's VC, and SiloD's storage beside it): cells per
    level of the cluster's cell hierarchy, by level name ({"node": 4}), cache bytes and remote IO bytes/s; and
    the scheduler it runs inside them (`TENANT_SCHEDULERS`)."""

    cells: Mapping[str, int] = field(default_factory=dict)
    cache_bytes: int = 0
    io_bytes_per_sec: float = 0.0
    scheduler: str = "fifo"


TENANT_SCHEDULERS = ("fifo", "tiresias")  # what a tenant may run inside its VC (`policies/hived.py`)
