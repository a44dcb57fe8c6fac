"""`silod umount`: apart from `fuse_client` because unmounting needs none of the code that serves a mount."""

from __future__ import annotations

import argparse
import sys

from fuseclient import daemon


def run_umount(args: argparse.Namespace) -> int:
    try:
        daemon.unmount(args.mountpoint, lazy=args.lazy)
    except OSError as exc:
        print(f"silod umount: {exc}", file=sys.stderr)
        return 1
    return 0
