"""Per-job access bitsets (epochs, progress, effective cache, remote demand) and the sliding-window rate meter."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable
from typing import TypeVar

import pytest
import trio
import trio.testing
from bitarray import bitarray

from fuseclient.access import AccessStats, AccessTracker, Counted, RateMeter
from silodlib.sharding import pass_share

T = TypeVar("T")


def bits(n: int, ones: Iterable[int] = ()) -> bitarray:
    array = bitarray(n)
    array.setall(0)
    for i in ones:
        array[i] = 1
    return array


def test_a_full_pass_in_any_order_completes_an_epoch() -> None:
    tracker = AccessTracker(10)
    order = list(range(10))
    random.Random(3).shuffle(order)
    for item in order[:-1]:
        tracker.record(item)
    assert (tracker.epoch, tracker.read.count()) == (1, 9)
    tracker.record(order[-1])
    stats = tracker.statistics(bits(10), 0.0)
    assert (stats.epoch, stats.completed_epochs, stats.items_read) == (2, 1, 0)
    assert tracker.read.count() == 0


def test_reading_an_item_again_ends_the_epoch_early_and_starts_the_next_with_it() -> None:
    tracker = AccessTracker(10)
    for item in [4, 7, 1]:
        tracker.record(item)
    tracker.record(7)
    stats = tracker.statistics(bits(10), 0.0)
    assert (stats.epoch, stats.completed_epochs, stats.items_read) == (2, 1, 1)
    assert tracker.read == bits(10, [7])


def test_epochs_keep_counting_across_passes() -> None:
    tracker = AccessTracker(4)
    rng = random.Random(5)
    for _ in range(3):
        for item in rng.sample(range(4), 4):
            tracker.record(item)
    tracker.record(2)
    assert tracker.epoch == 4
    assert tracker.statistics(bits(4), 0.0).completed_epochs == 3


def test_a_pass_whose_accesses_all_failed_is_no_epoch_and_the_pass_that_delivers_is_one() -> None:
    # Storage refused every read (an expired SAS): each open was recorded, then taken back when its read failed.
    tracker = AccessTracker(10)
    for item in range(10):
        tracker.take_back(item, tracker.record(item, pending=True))
    assert (tracker.closed_epochs, tracker.read.count()) == (0, 0)
    for item in range(10):
        tracker.deliver(item, tracker.record(item, pending=True))
    assert (tracker.closed_epochs, tracker.epoch) == (1, 2)


def test_a_pass_is_not_complete_while_an_access_is_pending_and_a_failed_last_item_leaves_it_open() -> None:
    tracker = AccessTracker(10)
    for item in range(9):
        tracker.record(item)
    epoch = tracker.record(9, pending=True)
    stats = tracker.statistics(bits(10), 100.0)
    assert (tracker.closed_epochs, stats.items_read, stats.progress) == (0, 10, 1.0)  # opened, counted, not done
    assert stats.remote_demand_bytes_per_sec == 0.0  # nothing left to open
    assert tracker.take_back(9, epoch)
    assert (tracker.closed_epochs, tracker.read.count(), tracker.read[9]) == (0, 9, 0)
    tracker.deliver(9, tracker.record(9, pending=True))  # the retry is the item's first access of the pass
    assert (tracker.closed_epochs, tracker.epoch, tracker.read.count()) == (1, 2, 0)


def test_the_accesses_of_a_pass_settle_in_any_order_and_the_last_delivery_completes_it() -> None:
    # Parallel workers: every item opened, their reads returning in another order.
    tracker = AccessTracker(4)
    epochs = {item: tracker.record(item, pending=True) for item in range(4)}
    for item in (2, 0, 3):
        tracker.deliver(item, epochs[item])
        assert tracker.closed_epochs == 0
    tracker.deliver(1, epochs[1])
    assert tracker.closed_epochs == 1


def test_a_taken_back_access_cannot_be_taken_back_twice_nor_once_its_epoch_has_ended() -> None:
    tracker = AccessTracker(10)
    epoch = tracker.record(0, pending=True)
    tracker.deliver(0, epoch)
    assert not tracker.take_back(0, epoch)  # delivered: it stands (a later read of it failed)
    epoch = tracker.record(1, pending=True)
    assert tracker.take_back(1, epoch) and not tracker.take_back(1, epoch)
    epoch = tracker.record(1, pending=True)
    tracker.record(0)  # the loader's retry of the failed read of 0: it counts nothing
    assert tracker.closed_epochs == 0
    tracker.record(0)  # a repeat with most of the pass unread: the job is on its next pass
    assert tracker.closed_epochs == 1
    assert not tracker.take_back(1, epoch)
    assert tracker.read == bits(10, [0])


def test_an_access_of_the_next_pass_taken_back_during_an_overlap_leaves_the_overlap_and_the_old_pass_alone() -> None:
    tracker = AccessTracker(10)
    for item in range(9):
        tracker.record(item)
    epoch = tracker.record(0, pending=True)  # the next pass's first access: an overlap
    assert (epoch, tracker.epoch) == (2, 2)
    assert tracker.take_back(0, epoch)
    assert (tracker.epoch, tracker.read.count()) == (2, 0)
    later = tracker.record(1, pending=True)  # the next pass again, pending while the old one completes
    tracker.record(9)
    assert (tracker.closed_epochs, tracker.read) == (1, bits(10, [1]))
    tracker.deliver(1, later)
    for item in range(2, 10):
        tracker.record(item)
    assert tracker.closed_epochs == 1  # item 0 of the pass is missing
    tracker.record(0)
    assert tracker.closed_epochs == 2


def test_with_a_share_a_taken_back_access_can_leave_a_whole_pass_delivered() -> None:
    tracker = AccessTracker(10, share=0.5)
    for item in range(4):
        tracker.record(item)
    epoch = tracker.record(4, pending=True)
    tracker.record(5)  # the share's five, and one more, opened; one still pending
    assert tracker.closed_epochs == 0
    tracker.take_back(4, epoch)
    assert tracker.closed_epochs == 1


def loader_accesses(
    items: int,
    passes: int,
    workers: int,
    batch: int,
    *,
    seed: int = 0,
    drop_last: bool = False,
    ranks: tuple[int, int] = (0, 1),
) -> list[tuple[int, int]]:
    """Item accesses as a mount sees a data loader's: a step-based sampler (detectron2's TrainingSampler)
    draws shuffle after shuffle in one stream of batches, without each pass's last partial batch if
    `drop_last`, and with `ranks` = (rank, world size) only that rank's items of each shuffle, as
    DistributedSampler deals them. Returns (pass, item) per access, passes counted from 0.
    Each of `workers` workers takes the next batch when done with its own and reads its items in order; the
    workers advance at random relative speeds, so batches on either side of a shuffle's end interleave."""
    rng = random.Random(seed)
    stream: list[list[tuple[int, int]]] = []
    for number in range(passes):
        rank, world = ranks
        order = [(number, item) for item in rng.sample(range(items), items)[rank::world]]
        whole = len(order) - len(order) % batch if drop_last else len(order)
        stream.extend(order[start : start + batch] for start in range(0, whole, batch))
    cursors = {worker: (worker, 0) for worker in range(min(workers, len(stream)))}  # worker -> (batch, position)
    handed_out = len(cursors)
    accesses: list[tuple[int, int]] = []
    while cursors:
        worker = rng.choice(list(cursors))
        index, position = cursors[worker]
        accesses.append(stream[index][position])
        if position + 1 < len(stream[index]):
            cursors[worker] = (index, position + 1)
        elif handed_out < len(stream):
            cursors[worker] = (handed_out, 0)
            handed_out += 1
        else:
            del cursors[worker]
    return accesses


def mid_pass(
    tracker: AccessTracker,
    accesses: list[tuple[int, int]],
    per_pass: int,
    observe: Callable[[AccessTracker], T],
) -> list[T]:
    """Record `accesses` and return what `observe` says halfway through each pass of `per_pass` accesses."""
    seen = []
    for index, (_, item) in enumerate(accesses):
        tracker.record(item)
        if index % per_pass == per_pass // 2:
            seen.append(observe(tracker))
    return seen


def epoch(tracker: AccessTracker) -> int:
    return tracker.epoch


def test_parallel_workers_overlapping_at_shuffle_boundaries_count_one_epoch_per_pass() -> None:
    # The case found on a GPU node: 16 workers, a step-based sampler, 14 passes counted as 101 epochs.
    items, passes = 20_000, 14
    accesses = loader_accesses(items, passes, workers=16, batch=256, seed=7)
    tracker = AccessTracker(items)
    assert mid_pass(tracker, accesses, items, epoch) == list(range(1, passes + 1))
    assert tracker.closed_epochs == passes


@pytest.mark.parametrize("seed", range(3))
def test_parallel_workers_whose_failed_reads_are_retried_count_one_epoch_per_pass(seed: int) -> None:
    # Each open is pending while `workers` others begin; one in 20 fails and the loader opens it again at once:
    # the retry of an old pass's straggler comes after the next pass has read the item, and is not its repeat.
    items, passes, workers = 2000, 10, 16
    rng = random.Random(seed)
    tracker = AccessTracker(items)
    in_flight: deque[tuple[int, int]] = deque()
    for _, item in loader_accesses(items, passes, workers, batch=32, seed=seed):
        in_flight.append((item, tracker.record(item, pending=True)))
        while len(in_flight) > workers:
            item, epoch = in_flight.popleft()
            if rng.random() < 0.05:
                tracker.take_back(item, epoch)
                in_flight.append((item, tracker.record(item, pending=True)))
            else:
                tracker.deliver(item, epoch)
    while in_flight:
        tracker.deliver(*in_flight.popleft())
    assert tracker.closed_epochs == passes


def test_the_retry_of_a_straggler_the_next_pass_has_read_counts_in_the_old_pass() -> None:
    tracker = AccessTracker(10)
    for item in range(8):
        tracker.record(item)
    epoch = tracker.record(8, pending=True)  # the old pass's, in flight
    tracker.record(0)
    tracker.record(8)  # the next pass's first items: an overlap
    assert tracker.take_back(8, epoch)
    tracker.deliver(8, tracker.record(8, pending=True))  # the old pass's retry
    tracker.record(9)
    assert (tracker.closed_epochs, tracker.read) == (1, bits(10, [0, 8]))


def test_the_retry_of_a_chunked_file_whose_read_failed_counts_nothing_it_had_read_and_ends_no_epoch() -> None:
    # Four files of four chunks. The loader read chunks 0 and 1 of file 1, the read of chunk 2 failed, and it
    # reads the file again from the start. Before, its chunk 0 was a repeat with most of the pass unread: the
    # epoch ended there.
    tracker = AccessTracker(16)
    file_items = range(4, 8)
    for item in (4, 5):
        tracker.deliver(item, tracker.record(item, pending=True))
    assert tracker.take_back(6, tracker.record(6, pending=True), file_items=file_items)
    retry = [tracker.count(item, pending=True) for item in file_items]
    for item, counted in zip(file_items, retry, strict=True):
        tracker.deliver(item, counted.epoch)
    assert retry == [Counted(1, new=False)] * 2 + [Counted(1, new=True)] * 2  # the chunks it had read: nothing
    assert (tracker.closed_epochs, tracker.read) == (0, bits(16, file_items))
    for item in [*range(4), *range(8, 16)]:
        tracker.record(item)
    assert (tracker.closed_epochs, tracker.read.count()) == (1, 0)


def test_a_retry_uses_up_its_marks_so_reading_the_file_once_more_is_the_next_pass() -> None:
    tracker = AccessTracker(16)
    for item in (4, 5):
        tracker.record(item)
    assert not tracker.take_back(5, 1, file_items=range(4, 8))  # delivered already: a later read of it failed
    for item in range(4, 8):
        tracker.record(item)
    assert tracker.closed_epochs == 0
    tracker.record(4)  # a repeat with most of the pass unread: the job is on its next pass
    assert (tracker.closed_epochs, tracker.read) == (1, bits(16, [4]))


def test_the_retry_of_an_old_passs_chunked_file_during_an_overlap_counts_in_the_old_pass() -> None:
    # The next pass has begun (an overlap) with the chunks the old pass's failed open of the file had read.
    tracker = AccessTracker(16)
    for item in [*range(4), *range(8, 14), 4, 5]:
        tracker.record(item)
    epoch = tracker.record(6, pending=True)
    for item in (4, 5):  # the next pass's
        tracker.record(item)
    assert tracker.epoch == 2
    assert tracker.take_back(6, epoch, file_items=range(4, 8))
    retry = [tracker.count(item) for item in range(4, 8)]
    assert retry == [Counted(1, new=False)] * 2 + [Counted(1, new=True)] * 2
    assert (tracker.closed_epochs, tracker.epoch) == (0, 2)
    for item in (14, 15):
        tracker.record(item)
    assert (tracker.closed_epochs, tracker.read) == (1, bits(16, [4, 5]))


def test_the_retry_of_a_next_passs_chunked_file_during_an_overlap_neither_ends_the_old_pass_nor_counts() -> None:
    tracker = AccessTracker(16)
    for item in range(14):
        tracker.record(item)
    tracker.record(4)  # the next pass's first chunk: an overlap
    assert tracker.take_back(5, tracker.record(5, pending=True), file_items=range(4, 8))
    retry = [tracker.count(item) for item in range(4, 8)]
    assert retry == [Counted(2, new=False), Counted(2, new=True), Counted(2, new=True), Counted(2, new=True)]
    assert (tracker.closed_epochs, tracker.epoch) == (0, 2)
    for item in (14, 15):
        tracker.record(item)
    assert (tracker.closed_epochs, tracker.read) == (1, bits(16, range(4, 8)))


def chunked_loader(
    tracker: AccessTracker, files: int, chunks: int, passes: int, workers: int, failure: float, seed: int
) -> int:
    """Drive `tracker` as a mount sees a loader's `workers` threads reading `passes` shuffles of `files` files
    of `chunks` chunks each: a thread takes the next file, reads its chunks in order, one read in flight (pending
    while the other threads go on), and when a read fails (at random, `failure` of them) opens the file again and
    reads it from the start. Returns the reads that failed."""
    rng = random.Random(seed)
    stream = iter([file for _ in range(passes) for file in rng.sample(range(files), files)])
    reading: dict[int, tuple[int, int, int | None]] = {}  # thread -> (file, next chunk, epoch of the one in flight)
    for thread in range(workers):
        reading[thread] = (next(stream), 0, None)
    failed = 0
    while reading:
        thread = rng.choice(list(reading))
        file, chunk, epoch = reading[thread]
        file_items = range(file * chunks, (file + 1) * chunks)
        if epoch is not None:  # the read in flight returns
            if rng.random() < failure:
                tracker.take_back(file_items[chunk], epoch, file_items=file_items)
                failed += 1
                chunk = 0  # the retry: the whole file again
            else:
                tracker.deliver(file_items[chunk], epoch)
                chunk += 1
        if chunk == chunks:
            following = next(stream, None)
            if following is None:
                del reading[thread]
                continue
            file, chunk, file_items = following, 0, range(following * chunks, (following + 1) * chunks)
        reading[thread] = (file, chunk, tracker.record(file_items[chunk], pending=True))
    return failed


@pytest.mark.parametrize("seed", range(4))
def test_parallel_threads_retrying_chunked_files_whose_reads_failed_count_one_epoch_per_pass(seed: int) -> None:
    # Before, each retry's first chunk repeated a chunk its failed open had read, ending the epoch early.
    passes = 12
    tracker = AccessTracker(40 * 8)
    failed = chunked_loader(tracker, files=40, chunks=8, passes=passes, workers=4, failure=0.02, seed=seed)
    assert failed > passes
    assert tracker.closed_epochs == passes


def test_opens_of_an_item_at_once_are_one_access_taken_back_only_when_every_one_failed() -> None:
    # Threads opening one file together while storage refuses reads. Before, each open after the first was a
    # repeat that ended the epoch: 8 opens, 8 epochs, no data.
    tracker = AccessTracker(10)
    epochs = [tracker.record(3, pending=True) for _ in range(8)]
    assert (epochs, tracker.read) == ([1] * 8, bits(10, [3]))
    assert [tracker.take_back(3, epoch) for epoch in epochs] == [False] * 7 + [True]
    assert (tracker.closed_epochs, tracker.read.count()) == (0, 0)


def test_opens_of_an_item_at_once_deliver_it_if_any_one_does_and_count_it_once() -> None:
    tracker = AccessTracker(10)
    counted = [tracker.count(3, pending=True) for _ in range(3)]
    assert counted == [Counted(1, new=True)] + [Counted(1, new=False)] * 2
    assert not tracker.take_back(3, 1)
    tracker.deliver(3, 1)
    assert not tracker.take_back(3, 1)  # its read failed after another delivered the item: it stands
    assert tracker.count(3) == Counted(1, new=False)  # that one's retry
    for item in [*range(3), *range(4, 10)]:
        tracker.record(item)
    assert (tracker.closed_epochs, tracker.read.count()) == (1, 0)


def test_opens_of_a_passs_last_item_at_once_that_all_failed_end_no_epoch() -> None:
    # With the pass nearly read, the second open is taken for the next pass's (an overlap); the others join it.
    tracker = AccessTracker(10)
    for item in range(9):
        tracker.record(item)
    epochs = [tracker.record(9, pending=True) for _ in range(8)]
    assert epochs == [1] + [2] * 7
    for epoch in epochs:
        tracker.take_back(9, epoch)
    assert (tracker.closed_epochs, tracker.read.count()) == (0, 0)
    tracker.record(9)  # the loader's retry, which storage serves
    assert (tracker.closed_epochs, tracker.read.count()) == (1, 0)


def test_near_the_end_of_a_pass_a_repeat_of_an_item_in_flight_is_the_next_passs_read() -> None:
    # Forked loader workers overlapping two passes: an item's read in the old one has not returned (or the kernel
    # has not sent the release of an open it served from its page cache) when the next pass opens it.
    tracker = AccessTracker(10)
    for item in range(8):
        tracker.record(item)
    epoch = tracker.record(8, pending=True)
    assert tracker.count(8, pending=True) == Counted(2, new=True)
    tracker.deliver(8, epoch)
    tracker.record(9)
    assert (tracker.closed_epochs, tracker.read) == (1, bits(10, [8]))


def test_the_pass_in_progress_is_reported_while_the_last_one_has_stragglers_in_flight() -> None:
    items = 1000
    accesses = loader_accesses(items, 2, workers=8, batch=32, seed=3)
    tracker = AccessTracker(items)
    seen = accesses[: items + 100]  # the first pass's stragglers still in flight
    for _, item in seen:
        tracker.record(item)
    stats = tracker.statistics(bits(items, range(items)), 1000.0)  # everything cached
    second_pass = sum(number == 1 for number, _ in seen)
    in_flight = items - (len(seen) - second_pass)  # the first pass's items not read yet
    assert in_flight > 0
    assert stats.epoch == 2
    # Exact but for a second-pass read of an item whose first-pass read is still in flight: until that
    # comes, the straggler taken for it counts in the first pass.
    assert second_pass - in_flight <= stats.items_read <= second_pass
    assert stats.effective_cache_items == items - stats.items_read  # hits still to come in the new pass


def test_passes_that_drop_their_last_partial_batch_count_one_epoch_each() -> None:
    # drop_last leaves a few items out of each pass, another few each time: no pass reads every item.
    items, passes = 4000, 6
    accesses = loader_accesses(items, passes, workers=4, batch=64, seed=11, drop_last=True)
    assert mid_pass(AccessTracker(items), accesses, len(accesses) // passes, epoch) == list(range(1, passes + 1))


@pytest.mark.parametrize("world", [2, 8])
def test_a_node_reading_its_share_of_each_pass_counts_one_epoch_per_pass(world: int) -> None:
    # One rank of a DistributedSampler job per node: another random 1/world of the items each pass.
    items, passes = 8000, 5
    accesses = loader_accesses(items, passes, workers=1, batch=32, seed=5, ranks=(1, world))
    per_pass = items // world
    tracker = AccessTracker(items, share=pass_share(1, world))

    def epoch_and_progress(tracker: AccessTracker) -> tuple[int, float]:
        stats = tracker.statistics(bits(items), 0.0)
        return stats.epoch, round(stats.progress, 1)

    seen = mid_pass(tracker, accesses, per_pass, epoch_and_progress)
    assert seen == [(number, 0.5) for number in range(1, passes + 1)]
    assert tracker.closed_epochs == passes


@pytest.mark.parametrize("world", [2, 8])
def test_a_node_reading_its_share_with_parallel_workers_counts_about_one_epoch_per_pass(world: int) -> None:
    # Workers overlapping at the shuffle boundary, as above, on a node's share: the old pass's stragglers
    # cannot always be told from the new pass's items there, so a stray epoch may be counted (each repeat
    # ending an epoch counted 16-18 for these 10 passes).
    items, passes = 8000, 10
    accesses = loader_accesses(items, passes, workers=4, batch=32, seed=5, ranks=(0, world))
    tracker = AccessTracker(items, share=pass_share(1, world))
    for _, item in accesses:
        tracker.record(item)
    assert passes <= tracker.closed_epochs <= passes + 1


def test_a_nodes_share_of_a_job_is_its_workers_over_the_jobs() -> None:
    assert pass_share(2, 8) == 0.25
    assert pass_share(3, 3) == 1.0
    assert pass_share(2, 0) == pass_share(0, 4) == 1.0  # not known: every item


def test_progress_is_the_fraction_of_items_read_this_epoch() -> None:
    tracker = AccessTracker(8)
    for item in [0, 5, 6]:
        tracker.record(item)
    stats = tracker.statistics(bits(8), 0.0)
    assert (stats.items_read, stats.item_count, stats.progress) == (3, 8, 3 / 8)


def test_effective_cache_counts_cached_items_not_yet_read_this_epoch() -> None:
    tracker = AccessTracker(10)
    for item in [0, 1, 2, 7]:
        tracker.record(item)
    cached = bits(10, [1, 2, 3, 4, 9])  # 1 and 2 already read: 3 hits still to come
    assert tracker.statistics(cached, 0.0).effective_cache_items == 3


def test_remote_demand_is_throughput_times_the_uncached_share_of_the_rest_of_the_epoch() -> None:
    tracker = AccessTracker(10)
    for item in [0, 1, 2, 3]:
        tracker.record(item)
    cached = bits(10, [0, 1, 4, 5])  # 6 items left, 2 of them cached
    stats = tracker.statistics(cached, 600.0)
    assert stats.remote_demand_bytes_per_sec == pytest.approx(600.0 * 4 / 6)
    assert stats.throughput_bytes_per_sec == 600.0


def test_remote_demand_at_the_start_of_an_epoch_is_the_papers_f_times_one_minus_c_over_d() -> None:
    tracker = AccessTracker(10)
    for item in range(10):
        tracker.record(item)
    stats = tracker.statistics(bits(10, range(3)), 1000.0)
    assert (stats.epoch, stats.items_read) == (2, 0)
    assert stats.remote_demand_bytes_per_sec == pytest.approx(1000.0 * (1 - 3 / 10))


def test_nothing_cached_means_demand_equals_throughput() -> None:
    tracker = AccessTracker(10)
    tracker.record(3)
    assert tracker.statistics(bits(10), 750.0).remote_demand_bytes_per_sec == 750.0


def test_everything_left_cached_means_zero_demand() -> None:
    tracker = AccessTracker(10)
    for item in range(5):
        tracker.record(item)
    assert tracker.statistics(bits(10, range(5, 10)), 750.0).remote_demand_bytes_per_sec == 0.0
    assert tracker.statistics(bits(10, range(10)), 750.0).remote_demand_bytes_per_sec == 0.0


def test_with_one_item_left_demand_is_all_or_nothing() -> None:
    tracker = AccessTracker(3)
    tracker.record(0)
    tracker.record(1)
    assert tracker.statistics(bits(3, [2]), 500.0).remote_demand_bytes_per_sec == 0.0
    assert tracker.statistics(bits(3, [0, 1]), 500.0).remote_demand_bytes_per_sec == 500.0


def test_statistics_reads_but_does_not_change_the_bitsets() -> None:
    tracker = AccessTracker(6)
    tracker.record(1)
    cached = bits(6, [1, 2])
    tracker.statistics(cached, 1.0)
    assert (tracker.read, cached) == (bits(6, [1]), bits(6, [1, 2]))


def test_statistics_at_imagenet_scale_count_the_items_read_and_the_cached_ones_still_unread() -> None:
    items = 1_281_167
    tracker = AccessTracker(items)
    for item in range(0, items, 2):
        tracker.record(item)
    cached = bitarray(items)
    cached.setall(0)
    cached[: items // 5] = 1
    stats = tracker.statistics(cached, 1e9)
    assert stats.items_read == (items + 1) // 2
    assert stats.effective_cache_items == items // 5 // 2  # the odd items of the cached fifth


@pytest.mark.parametrize("item", [-1, 10, 11])
def test_an_item_outside_the_dataset_is_an_index_error(item: int) -> None:
    tracker = AccessTracker(10)
    with pytest.raises(IndexError, match=f"item {item} is outside 0..9"):
        tracker.record(item)
    assert tracker.read.count() == 0


def test_invalid_arguments_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"^item_count must be"):
        AccessTracker(0)
    tracker = AccessTracker(10)
    with pytest.raises(ValueError, match=r"^cached has 9 bits"):
        tracker.statistics(bits(9), 1.0)
    with pytest.raises(ValueError, match=r"^throughput_bytes_per_sec must be"):
        tracker.statistics(bits(10), -1.0)
    for share in (0.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"^share must be in \(0, 1\]"):
            AccessTracker(10, share)
    with pytest.raises(ValueError, match=r"^window_seconds must be"):
        RateMeter(0)


def test_statistics_is_a_frozen_snapshot() -> None:
    stats = AccessTracker(2).statistics(bits(2), 0.0)
    assert stats == AccessStats(1, 0, 0, 2, 0.0, 0, 0.0, 0.0)
    with pytest.raises(AttributeError):
        stats.epoch = 5  # type: ignore[misc]


def test_rate_meter_measures_a_steady_stream() -> None:
    meter = RateMeter(5.0)
    for tick in range(1, 3001):  # 10 bytes every 10 ms for 30 s
        meter.add(10, tick / 100)
    assert meter.rate(30.0) == pytest.approx(1000.0, rel=0.01)


def test_rate_meter_forgets_traffic_older_than_the_window() -> None:
    meter = RateMeter(5.0)
    for tick in range(1, 101):  # 10 s at 1000 B/s, then silence
        meter.add(100, tick / 10)
    assert meter.rate(12.5) == pytest.approx(500.0, rel=0.05)  # half the window still holds traffic
    assert meter.rate(15.1) == 0.0


def test_a_young_meter_divides_by_the_time_since_its_first_sample() -> None:
    meter = RateMeter(5.0)
    meter.add(1000, 100.0)
    assert meter.rate(101.0) == pytest.approx(1000.0)  # not 1000 / 5
    assert meter.rate(110.0) == 0.0


def test_a_meter_never_divides_by_almost_zero() -> None:
    meter = RateMeter(5.0)
    assert meter.rate(0.0) == 0.0
    meter.add(1000, 3.0)
    assert meter.rate(3.0) == pytest.approx(1000 / 0.1)  # one bucket's worth of time


def test_a_meter_keeps_bounded_memory_under_heavy_traffic() -> None:
    meter = RateMeter(1.0)
    for tick in range(100_000):
        meter.add(1, tick / 1000)
    assert len(meter._buckets) <= 51
    assert meter.rate(100.0) == pytest.approx(1000.0, rel=0.01)


def test_a_meter_reads_trios_clock_when_no_time_is_given() -> None:
    async def main() -> None:
        meter = RateMeter(5.0)
        await trio.sleep(100)
        meter.add(1000)
        await trio.sleep(2)
        assert meter.rate() == pytest.approx(500.0)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
