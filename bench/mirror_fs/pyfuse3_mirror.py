"""The floor of silod's FUSE stack: a read-only mirror of a directory on pyfuse3 and trio that does nothing but
answer (no cache, no throttle, no access tracking), so what it costs per request is what pyfuse3 and trio cost.

Opens carry `keep_cache`, as silod's opens of cached items do; entries and attributes are cached a day.

    python bench/mirror_fs/pyfuse3_mirror.py SOURCE_DIR MOUNTPOINT    (foreground; unmount to stop)
"""

from __future__ import annotations

import errno
import os
import sys

import pyfuse3
import trio

TIMEOUT = 24 * 3600.0


class Mirror(pyfuse3.Operations):
    def __init__(self, root: str) -> None:
        super().__init__()
        self._paths = {pyfuse3.ROOT_INODE: root}
        self._inodes = {root: pyfuse3.ROOT_INODE}

    def _inode(self, path: str) -> int:
        if path not in self._inodes:
            self._inodes[path] = len(self._paths) + 1
            self._paths[self._inodes[path]] = path
        return self._inodes[path]

    def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        found = os.lstat(self._paths[inode])
        attributes = pyfuse3.EntryAttributes()
        for name in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size"):
            setattr(attributes, name, getattr(found, name))
        attributes.st_ino = inode
        attributes.entry_timeout = attributes.attr_timeout = TIMEOUT
        return attributes

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self._attributes(inode)

    async def lookup(self, parent: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        path = os.path.join(self._paths[parent], os.fsdecode(name))
        if not os.path.lexists(path):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(self._inode(path))

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        return inode

    async def readdir(self, fh: int, start: int, token: pyfuse3.ReaddirToken) -> None:
        names = sorted(os.listdir(self._paths[fh]))
        for position, name in enumerate(names[start:], start):
            attributes = self._attributes(self._inode(os.path.join(self._paths[fh], name)))
            if not pyfuse3.readdir_reply(token, os.fsencode(name), attributes, position + 1):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        return pyfuse3.FileInfo(fh=os.open(self._paths[inode], os.O_RDONLY), keep_cache=True)

    async def read(self, fh: int, offset: int, size: int) -> bytes:
        return os.pread(fh, size, offset)

    async def release(self, fh: int) -> None:
        os.close(fh)


def main() -> None:
    source, mountpoint = sys.argv[1:3]
    pyfuse3.init(Mirror(os.path.abspath(source)), mountpoint, {"fsname=pyfuse3_mirror", "ro"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close()


if __name__ == "__main__":
    main()
