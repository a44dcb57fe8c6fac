"""One open of a job's file: everything a file handle carries from `open` to `release`.

Opening a file of one item is that item's access: its later reads may never reach the daemon (the kernel
serves them from its page cache under `keep_cache`, which it gets when the item is cached here), so such an
open counts as the whole file read from the cache (`MountedJob.count_cached_read`), and reads through it that
do reach the daemon count nothing more. Counted on its reads, a second pass over cached files counted nothing. A file of
several items (chunks) counts each on the first read through this handle that covers it, and marks one the
handle fetched ahead of the reader as such. Items the handle fetched and may still read (an item the cache
did not admit, the next chunk of a sequential reader) stay with it (`readpath.FetchedItems`), so one miss
costs one backend GET however many kernel reads cover it.
"""

from __future__ import annotations

from fuseclient import readpath
from fuseclient.mounted import MountedJob


class OpenFile:
    __slots__ = ("_fetched", "_items_seen", "chunked", "file_index", "job", "keep_cache")

    def __init__(self, job: MountedJob, file_index: int) -> None:
        self.job = job
        self.file_index = file_index
        manifest = job.dataset.manifest
        first_item = manifest.first_items[file_index]
        self.chunked = manifest.first_items[file_index + 1] - first_item != 1
        self.keep_cache = False  # let the kernel keep serving this file from its page cache
        self._items_seen: set[int] = set()  # chunks already counted for this open
        self._fetched = readpath.FetchedItems()
        if not self.chunked:
            job.record_access(first_item)
            self.keep_cache = job.dataset.cache.contains(first_item)
            if self.keep_cache:
                job.count_cached_read(manifest.sizes[file_index])

    async def read(self, offset: int, size: int) -> bytes:
        """Up to `size` bytes from `offset`; raises `BackendError` when the backend fails the item."""
        if self.chunked:
            self._count_chunks(offset, size)
        return await readpath.read(self.job, self.file_index, offset, size, self._fetched, counted=self.keep_cache)

    def _count_chunks(self, offset: int, size: int) -> None:
        for item in self.job.dataset.manifest.items_covering(self.file_index, offset, size):
            if item not in self._items_seen:
                self._items_seen.add(item)
                self.job.record_access(item, read_ahead=item in self._fetched.items)
