"""One open of a job's file: everything a file handle carries from `open` to `release`.

Opening a file of one item is that item's access: its later reads may never reach the daemon (the kernel
serves them from its page cache under `keep_cache`, which it gets when the item is cached here), so such an
open counts as the whole file read from the cache (`MountedJob.count_read`), and reads through it that
do reach the daemon count nothing more. Counted on its reads, a second pass over cached files counted nothing. A file of
several items (chunks) counts each on the first read through this handle that covers it, and marks one the
handle fetched ahead of the reader as such. Items the handle fetched and may still read (an item the cache
did not admit, the next chunk of a sequential reader) stay with it (`readpath.FetchedItems`), so one miss
costs one backend GET however many kernel reads cover it, within the node's budget for them (`ReadBuffers`).

An access is pending until the handle's reads tell whether it delivered the item: the first read covering the
item that succeeds delivers it, one that fails first takes it back (a pass of failed reads is no epoch), and
an access still pending at `release` was served from the page cache. A later successful read of an item taken
back counts it again. A failed read reports the items it covered that this handle had delivered too: they stand,
but the loader will read the file again from the start, and that retry's reads of what the pass has read count
nothing (`AccessTracker`).
"""

from __future__ import annotations

from fuseclient import readpath
from fuseclient.mounted import Access, MountedJob
from fuseclient.read_buffers import ReadBuffers


class OpenFile:
    __slots__ = ("_counted", "_fetched", "_pending", "chunked", "file_index", "job", "keep_cache")

    def __init__(self, job: MountedJob, file_index: int, buffers: ReadBuffers) -> None:
        self.job = job
        self.file_index = file_index
        manifest = job.dataset.manifest
        first_item = manifest.first_items[file_index]
        self.chunked = manifest.first_items[file_index + 1] - first_item != 1
        self.keep_cache = False  # let the kernel keep serving this file from its page cache
        self._counted: dict[int, Access] = {}  # items counted for this open, by item
        self._pending: set[int] = set()  # of them, those whose access no read has settled yet
        self._fetched = readpath.FetchedItems(buffers)
        if not self.chunked:
            self._count(first_item, pending=True)
            self.keep_cache = job.dataset.cache.contains(first_item)
            if self.keep_cache:
                job.count_read(manifest.sizes[file_index])

    async def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset`; raises `BackendError` when the backend fails the item."""
        items = self.job.dataset.manifest.items_covering(self.file_index, offset, size)
        for item in items:
            if item not in self._counted:
                self._count(item, pending=True)
        try:
            data = await readpath.read(self.job, self.file_index, offset, size, self._fetched, counted=self.keep_cache)
        except BaseException:
            for item in items:
                if (access := self._counted.get(item)) is not None:
                    if item in self._pending:
                        del self._counted[item]
                        self._pending.remove(item)
                    self.job.take_back(access)  # a delivered one stands, but the loader's retry is to come
            raise
        for item in items:
            if item not in self._counted:  # taken back by a read of it that failed meanwhile
                self._count(item, pending=False)
            elif item in self._pending:
                self._pending.remove(item)
                self.job.deliver(self._counted[item])
        return data

    def release(self) -> None:
        """The last descriptor of this open is closed: accesses no read settled were served from the page cache, and
        the bytes it held go."""
        self._fetched.release()
        for item in self._pending:
            self.job.deliver(self._counted[item])
        self._pending.clear()
        self._counted.clear()

    def _count(self, item: int, *, pending: bool) -> None:
        self._counted[item] = self.job.record_access(item, read_ahead=item in self._fetched, pending=pending)
        if pending:
            self._pending.add(item)
