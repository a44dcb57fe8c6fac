"""A tenant's virtual cluster from a TOML file (`silod tenant add NAME --vc FILE`), in the simulator's words.

The keys are those of a tenant's table in a simulated cluster (`datamgr.scheduler.sim.tenants`), read by the
same code, so one description serves both:

```toml
cells = { node = 2 }      # cells of each level of the data manager's --cell-levels
cache = "2TB"             # optional: cache reserved for the tenant's jobs (default 0)
remote_io = "400MB/s"     # optional: remote IO reserved for them (default 0)
```

A file of `[NAME]` tables (what `silod sim --tenants` takes) gives the table of the tenant's name.
"""

from __future__ import annotations

from pathlib import Path

from datamgr.scheduler.sim.fields import SimInputError, load_toml
from datamgr.scheduler.sim.tenants import TENANT_KEYS, tenants_from_table
from silodcli.args import CommandLineError


def read_vc(path: Path, name: str) -> tuple[dict[str, int], int, int]:
    """The cells (by level name), cache bytes and remote IO bytes/s of tenant `name`'s VC in the file; a
    CommandLineError naming the file, the key and the rule for anything else."""
    try:
        document = load_toml(path)
    except SimInputError as exc:
        raise CommandLineError(f"--vc: {exc}") from None
    try:
        table = document if "cells" in document else _named_table(document, name, path)
        share = tenants_from_table({name: table}, f"--vc {path}")[name]
    except SimInputError as exc:
        raise CommandLineError(str(exc).replace(f"--vc {path}: tenant {name!r}: ", f"--vc {path}: ")) from None
    if share.scheduler != "fifo":
        raise CommandLineError(
            f"--vc {path}: scheduler: a live tenant runs fifo inside its VC (the data manager takes no other yet);"
            " leave scheduler out"
        )
    return dict(share.cells), share.cache_bytes, int(share.io_bytes_per_sec)


def _named_table(document: dict[str, object], name: str, path: Path) -> object:
    if name in document:
        return document[name]
    tables = ", ".join(f"[{key}]" for key, value in document.items() if isinstance(value, dict))
    raise SimInputError(
        f"--vc {path}: expected {', '.join(TENANT_KEYS)} (cells at least), or a [{name}] table"
        + (f"; its tables are {tables}" if tables else "")
    )
