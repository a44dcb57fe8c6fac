"""`silod umount`: apart from `fuse_client` because unmounting needs none of the code that serves a mount."""

from __future__ import annotations

import argparse
import sys

from fuseclient import daemon


def run_umount(args: argparse.Namespace) -> int:
    """Unmount a silod mount, live or left dead by a killed daemon; anything else is refused, naming it: a
    directory with nothing mounted, or another file system, which is not ours to unmount."""
    if not daemon.has_silod_mount(args.mountpoint):
        print(f"silod umount: {args.mountpoint} is not a silod mount; nothing unmounted", file=sys.stderr)
        return 1
    try:
        daemon.unmount(args.mountpoint, lazy=args.lazy)
    except OSError as exc:
        print(f"silod umount: {exc}", file=sys.stderr)
        return 1
    return 0
