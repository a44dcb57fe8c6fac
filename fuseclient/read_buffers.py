"""The node's budget for the bytes of fetched items its open files hold for their next reads.

A module of its own, apart from what a mount serves (`mounted`), so that the command line can take its default
without importing the mount's machinery (trio, pyfuse3).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# The node's read buffers by default: 64 items of the default chunk (4 MiB). Buffers only hold items the cache did not
# admit, and only until their open has read them whole, so what they must cover is the reads under way: 32 readers
# streaming large uncached files (each holds its chunk and the next, fetched ahead) or 64 reading items of a chunk in
# several kernel requests, as many as a node's loaders usually have under way; and a quarter of a GiB is little beside
# what a training node's memory holds, where an agent grew by 880 MiB holding 867 opens.
DEFAULT_READ_BUFFER_BYTES = 256 * 1024 * 1024
# The least a node's read buffers may be given (`--read-buffer`): two items of the default chunk, what one open reading
# a large file holds at once (its chunk and the next, fetched ahead). Less, and a sequential reader's item would not
# fit: each of the kernel's requests for it would fetch it again from storage.
MIN_READ_BUFFER_BYTES = 8 * 1024 * 1024


def check_read_buffer(size: int) -> int:
    """`size` if it is a budget the read buffers may have (`MIN_READ_BUFFER_BYTES` or more)."""
    if size < MIN_READ_BUFFER_BYTES:
        raise ValueError(
            f"read buffer {size} B is below the least it may be, 8MiB: two items of the default 4MiB chunk, what one "
            "open reading a large file holds at once"
        )
    return size


@dataclass(frozen=True, slots=True)
class ReadBufferStats:
    """The read buffers' budget and the bytes they hold now; the same numbers feed metrics."""

    budget_bytes: int
    held_bytes: int


class ReadBuffers:
    """The bytes of fetched items that open files hold for their next reads, under one budget for the node.

    The kernel reads an item (up to a chunk, 4 MiB) in many requests of 128 KiB to 1 MiB, so an open file that fetched
    an item the cache did not admit keeps its bytes for the requests after the first (`readpath.FetchedItems`), or
    each would fetch it again. Kept per open until the file was closed, they grew with the number of open files, with
    nothing to bound them: a loader holding a handle on every shard (np.memmap, h5py, LMDB) took an agent from 81 to
    959 MiB with 867 opens. Here every open's buffers count against one budget, and the least recently read go first
    once it is spent: their open fetches the item again if it reads it again (`MountedJob.refetched_items`, which says
    the budget is too small for the node's readers). Owners are the open files' `FetchedItems`, by identity."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.held_bytes = 0
        self._held: OrderedDict[tuple[object, int], bytes] = OrderedDict()  # least recently read first

    def hold(self, owner: object, item: int, data: bytes) -> bool:
        """Hold `data`, the bytes of `item`, for `owner`, letting the least recently read buffers go to make room;
        False (nothing held) if `data` alone is over the budget. Opens that joined one fetch share its bytes, but each
        counts them: the budget errs on the safe side."""
        self.drop(owner, item)
        if len(data) > self.budget_bytes:
            return False
        while self.held_bytes + len(data) > self.budget_bytes:
            self.held_bytes -= len(self._held.popitem(last=False)[1])
        self._held[owner, item] = data
        self.held_bytes += len(data)
        return True

    def get(self, owner: object, item: int) -> bytes | None:
        """The bytes of `item` held for `owner` (now the most recently read), or None if none are (any more)."""
        data = self._held.get((owner, item))
        if data is not None:
            self._held.move_to_end((owner, item))
        return data

    def __contains__(self, key: tuple[object, int]) -> bool:
        """Whether bytes of the item are held for the owner, (owner, item)."""
        return key in self._held

    def drop(self, owner: object, item: int) -> None:
        """Let go of the bytes of `item` held for `owner`, if any."""
        data = self._held.pop((owner, item), None)
        if data is not None:
            self.held_bytes -= len(data)

    def statistics(self) -> ReadBufferStats:
        return ReadBufferStats(self.budget_bytes, self.held_bytes)
