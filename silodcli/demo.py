"""`silod demo`: the whole system on embedded defaults (`datamgr.demo`), as `make run` runs it."""

from __future__ import annotations

import argparse

from datamgr.demo import run_demo


def run(args: argparse.Namespace) -> int:
    return run_demo(args.backend, args.short)
