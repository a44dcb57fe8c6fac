"""`silod umount`: apart from `fuse_client` because unmounting needs none of the code that serves a mount."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from fuseclient import daemon
from silodlib.directories import user_name


def run_umount(args: argparse.Namespace) -> int:
    """Unmount a silod mount, live or left dead by a killed daemon; anything else is refused, naming it: a
    directory with nothing mounted, or another file system, which is not ours to unmount, and another user's
    mount, which fusermount3 would refuse with a misleading "entry ... not found in /etc/mtab"."""
    if not daemon.has_silod_mount(args.mountpoint):
        print(f"silod umount: {args.mountpoint} is not a silod mount; nothing unmounted", file=sys.stderr)
        return 1
    foreign = foreign_mount(args.mountpoint, os.getuid(), daemon.mount_owner(args.mountpoint))
    if foreign is not None:
        print(f"silod umount: {foreign}", file=sys.stderr)
        return 1
    try:
        daemon.unmount(args.mountpoint, lazy=args.lazy)
    except OSError as exc:
        print(f"silod umount: {exc}", file=sys.stderr)
        return 1
    return 0


def foreign_mount(mountpoint: Path, uid: int, owner: int | None) -> str | None:
    """Why user `uid` may not unmount the silod mount at `mountpoint` that user `owner` mounted (None: the
    mount table does not say), or None if it may: fusermount3 lets root unmount any mount, and any other user
    only their own."""
    if uid == 0 or owner is None or owner == uid:
        return None
    name = user_name(owner)
    who = "root" if owner == 0 else f"{name} or root"
    run = f"sudo silod umount {mountpoint}" if owner == 0 else f"silod umount {mountpoint} as {name} or root"
    return (
        f"{mountpoint} is {name}'s silod mount (uid {owner}), not {user_name(uid)}'s: only {who} can unmount "
        f"it ({run}); nothing unmounted"
    )
