"""The FUSE operations: a read-only tree with one directory per job, each showing that job's dataset.

Kept thin: it checks inputs, resolves inodes, and hands reads to `readpath`; our exceptions become errno
values in one place. Inode numbers encode (job slot, tree node) so no per-file inode table is needed:
`(slot + 1) << 40 | node`, where node 0 is the dataset's root, i.e. the job's directory.

The mount is read-only (the kernel answers EROFS to every write because it is mounted `ro`) and datasets are
immutable while mounted, so dataset entries and attributes carry a day-long timeout and a file whose item
is already in the local cache is opened with `keep_cache`: the kernel may then serve repeat reads from its
page cache, which can only turn local-cache hits into faster hits. Everything else is opened without
`keep_cache`, so each miss reaches the daemon and is fetched, throttled and counted.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Iterable
from itertools import chain

import pyfuse3

from fuseclient.failure_log import ReadFailureLog
from fuseclient.mounted import MountedJob, MountState
from fuseclient.openfile import OpenFile
from fuseclient.tree import NO_FILES_BENEATH
from silodlib.backends import AccessDenied, BackendError

log = logging.getLogger(__name__)

SLOT_SHIFT = 40
DATASET_TIMEOUT = 24 * 3600.0  # immutable content
ROOT_TIMEOUT = 1.0  # the set of jobs changes as jobs come and go
NAME_MAX = 255  # bytes in a name: what registration allows (`silodlib.manifest`) and POSIX file systems hold
DOT_ENTRIES = 2  # `.` and `..` open every listing
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT


class SilodFS(pyfuse3.Operations):
    """pyfuse3 operations over a `MountState`."""

    def __init__(self, mount: MountState) -> None:
        super().__init__()
        self._mount = mount
        self._handles: dict[int, OpenFile] = {}
        self._next_handle = 1
        self._uid, self._gid = os.getuid(), os.getgid()
        self._failed_reads = ReadFailureLog()  # storage failures logged at most a line every few seconds per job

    # ---- inodes ----

    def _resolve(self, inode: int) -> tuple[MountedJob, int]:
        job = self._mount.jobs_by_slot.get((inode >> SLOT_SHIFT) - 1)
        node = inode & ((1 << SLOT_SHIFT) - 1)
        if job is None or node >= job.dataset.tree.node_count:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return job, node

    @staticmethod
    def _inode(job: MountedJob, node: int) -> int:
        return ((job.slot + 1) << SLOT_SHIFT) | node

    def _attributes(self, inode: int) -> pyfuse3.EntryAttributes:
        attrs = pyfuse3.EntryAttributes()
        attrs.st_ino = inode
        attrs.st_uid, attrs.st_gid = self._uid, self._gid
        attrs.st_blksize = 128 * 1024
        if inode == pyfuse3.ROOT_INODE:
            attrs.st_mode = stat.S_IFDIR | 0o555
            attrs.st_nlink = 2 + len(self._mount.jobs)
            attrs.st_mtime_ns = attrs.st_ctime_ns = attrs.st_atime_ns = self._mount.jobs_changed_ns
            attrs.entry_timeout = attrs.attr_timeout = ROOT_TIMEOUT
            return attrs
        job, node = self._resolve(inode)
        tree = job.dataset.tree
        attrs.entry_timeout = attrs.attr_timeout = DATASET_TIMEOUT
        if tree.is_dir(node):
            attrs.st_mode = stat.S_IFDIR | 0o555
            attrs.st_nlink = 2 + len(tree.dirs[node].subdirs)
            newest_ns = tree.dir_mtimes_ns[node]
            if newest_ns == NO_FILES_BENEATH:  # only empty folders beneath: when this job came to the node
                newest_ns = job.added_ns
            attrs.st_mtime_ns = attrs.st_ctime_ns = attrs.st_atime_ns = newest_ns
            return attrs
        file_index = tree.file_index(node)
        size = job.dataset.manifest.sizes[file_index]
        attrs.st_mode = stat.S_IFREG | 0o444
        attrs.st_nlink = 1
        attrs.st_size = size
        attrs.st_blocks = -(-size // 512)
        attrs.st_mtime_ns = attrs.st_ctime_ns = attrs.st_atime_ns = job.dataset.manifest.mtimes_ns[file_index]
        return attrs

    # ---- metadata ----

    async def getattr(self, inode: int, ctx: pyfuse3.RequestContext | None = None) -> pyfuse3.EntryAttributes:
        return self._attributes(inode)

    async def lookup(self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext) -> pyfuse3.EntryAttributes:
        if len(name) > NAME_MAX:  # the kernel passes FUSE names of up to 1,024 bytes; statfs promises 255
            raise pyfuse3.FUSEError(errno.ENAMETOOLONG)
        text = os.fsdecode(name)
        if parent_inode == pyfuse3.ROOT_INODE:
            job = self._mount.jobs.get(text)
            if job is None:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attributes(self._inode(job, 0))
        job, node = self._resolve(parent_inode)
        found = job.dataset.tree.lookup(node, text) if job.dataset.tree.is_dir(node) else None
        if found is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attributes(self._inode(job, found))

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode != pyfuse3.ROOT_INODE:
            job, node = self._resolve(inode)
            if not job.dataset.tree.is_dir(node):
                raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        """List from position `start_id`: `.` and `..` at 0 and 1, then the entries; each entry's next id is its
        position + 1, so offsets are exact."""
        if fh == pyfuse3.ROOT_INODE:
            parent = pyfuse3.ROOT_INODE  # the kernel answers for what lies above the mount point
            jobs = sorted(self._mount.jobs.values(), key=lambda j: j.slot)
            entries: Iterable[tuple[int, str, int]] = (
                (job.slot + DOT_ENTRIES, job.job_id, self._inode(job, 0)) for job in jobs
            )
        else:
            job, node = self._resolve(fh)
            tree = job.dataset.tree
            parent = pyfuse3.ROOT_INODE if node == 0 else self._inode(job, tree.dirs[node].parent)
            first = max(start_id - DOT_ENTRIES, 0)
            entries = (
                (position + DOT_ENTRIES, tree.name(child), self._inode(job, child))
                for position, child in enumerate(tree.entries(node, first), start=first)
            )
        for position, name, inode in chain(((0, ".", fh), (1, "..", parent)), entries):
            if position >= start_id and not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._attributes(inode), position + 1
            ):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        data = pyfuse3.StatvfsData()
        datasets = self._mount.datasets.values()
        data.f_bsize = data.f_frsize = 4096
        data.f_blocks = sum(-(-d.manifest.size_bytes // 4096) for d in datasets)
        data.f_bfree = data.f_bavail = 0
        data.f_files = sum(d.tree.node_count for d in datasets) + 1
        data.f_ffree = data.f_favail = 0
        data.f_namemax = NAME_MAX
        return data

    # ---- file contents ----

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & _WRITE_FLAGS:
            raise pyfuse3.FUSEError(errno.EROFS)
        job, node = self._resolve(inode)
        if job.dataset.tree.is_dir(node):
            raise pyfuse3.FUSEError(errno.EISDIR)
        opened = OpenFile(job, job.dataset.tree.file_index(node), self._mount.read_buffers)
        handle = self._next_handle
        self._next_handle += 1
        self._handles[handle] = opened
        return pyfuse3.FileInfo(fh=handle, keep_cache=opened.keep_cache)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        opened = self._handles[fh]
        try:
            return await opened.read(off, size)
        except BackendError as exc:  # EACCES when storage refuses the read, else EIO
            denied = isinstance(exc, AccessDenied)
            opened.job.count_failed_read(denied=denied)
            self._failed_reads.failed(opened.job.job_id, opened.job.dataset.uri, exc)
            raise pyfuse3.FUSEError(errno.EACCES if denied else errno.EIO) from None

    async def release(self, fh: int) -> None:
        self._handles.pop(fh).release()


def forget_job_directory(job_id: str) -> None:
    """Tell the kernel that MOUNTPOINT/JOB_ID is gone (the job left this node), so that a lookup of it fails at
    once rather than when the root's entry timeout runs out; call on the trio loop that serves the mount."""
    pyfuse3.invalidate_entry_async(pyfuse3.ROOT_INODE, os.fsencode(job_id), ignore_enoent=True)
