"""ros/gc_pauses.py: the collector frozen after load, and every collection's pause measured
(pure Python: no rclpy, no torch)."""
import gc
import threading

import pytest

from vla_spec_ros.ros import gc_pauses
from vla_spec_ros.ros.gc_pauses import GcPauses, freeze_after_load, unfreeze


@pytest.fixture
def unfrozen():
    """Leaves the process's freezes as it found them (the suite shares one process)."""
    before = gc_pauses._num_freezes
    yield
    while gc_pauses._num_freezes > before:
        unfreeze()


def test_freeze_moves_what_exists_out_of_full_collections(unfrozen):
    class Node:
        pass
    alive = [Node() for _ in range(1000)]
    gc.collect()

    def in_oldest_generation():
        ids = {id(o) for o in gc.get_objects(generation=2)}
        return sum(id(x) in ids for x in alive)
    assert in_oldest_generation() == len(alive)       # what a full collection walks
    if gc_pauses._num_freezes:
        pytest.skip('a node of this process holds a freeze')
    frozen = freeze_after_load()
    # (>=: a thread of an earlier test may free a frozen object meanwhile; seen in CI.)
    assert frozen >= gc.get_freeze_count() >= len(alive)
    assert in_oldest_generation() == 0                # walked by no collection now
    unfreeze()
    assert gc.get_freeze_count() == 0 and in_oldest_generation() == len(alive)


def test_only_the_last_unfreeze_returns_the_objects(unfrozen):
    """Two nodes in one process: the first to unload leaves the other's objects frozen."""
    if gc_pauses._num_freezes:
        pytest.skip('a node of this process holds a freeze')
    freeze_after_load()
    freeze_after_load()
    unfreeze()
    assert gc.get_freeze_count() > 0
    unfreeze()
    assert gc.get_freeze_count() == 0
    unfreeze()                                        # unmatched: nothing happens
    assert gc_pauses._num_freezes == 0


def test_garbage_before_the_freeze_is_freed_not_frozen(unfrozen):
    import weakref

    class Cycle:
        pass
    a, b = Cycle(), Cycle()
    a.other, b.other = b, a                  # a reference cycle: only the collector frees it
    ref = weakref.ref(a)
    del a, b
    freeze_after_load()
    assert ref() is None


def test_pauses_are_measured_per_collection_and_expire_with_the_window():
    now = [100.0]
    ticks = iter([100.0, 100.25, 100.5, 100.5])     # start / stop of two collections

    def clock():
        return next(ticks, now[0])
    pauses = GcPauses(window_s=10.0, clock=clock)
    try:
        pauses._on_gc('start', {'generation': 2})
        pauses._on_gc('stop', {'generation': 2})     # 250 ms, full
        pauses._on_gc('start', {'generation': 0})
        pauses._on_gc('stop', {'generation': 0})     # 0 ms
        snap = pauses.snapshot(now_s=101.0)
        assert snap == {'gc_collections_in_window': 2, 'gc_full_collections_in_window': 1,
                        'gc_pause_max_ms': 250.0}
        pauses.clear()
        assert pauses.snapshot(now_s=101.0)['gc_collections_in_window'] == 0
        assert pauses.snapshot(now_s=200.0) == {'gc_collections_in_window': 0,
                                                'gc_full_collections_in_window': 0,
                                                'gc_pause_max_ms': 0.0}
    finally:
        pauses.close()


def test_a_real_collection_is_seen_and_close_stops_measuring():
    pauses = GcPauses(window_s=60.0)
    try:
        gc.collect()
        snap = pauses.snapshot()
        assert snap['gc_full_collections_in_window'] >= 1 and snap['gc_pause_max_ms'] > 0.0
    finally:
        pauses.close()
    pauses.close()                                   # idempotent
    before = pauses.snapshot()['gc_collections_in_window']
    gc.collect()
    assert pauses.snapshot()['gc_collections_in_window'] == before


def test_a_collection_started_inside_snapshot_does_not_hang_it():
    """Any allocation can start a collection, snapshot's own included; its callback then runs
    inside snapshot, on the same thread, and must not wait for anything snapshot holds. Here
    a collection starts, deterministically, while snapshot reads its events (an event whose
    time collects when subtracted from)."""
    class CollectingTime(float):
        def __rsub__(self, now):
            gc.collect()
            return now - float(self)

    pauses = GcPauses(window_s=1e9)
    result = []
    try:
        pauses._events.append((CollectingTime(0.0), 0.001, 0))
        worker = threading.Thread(target=lambda: result.append(pauses.snapshot(now_s=1.0)),
                                  daemon=True)
        worker.start()
        worker.join(timeout=30)
    finally:
        pauses.close()
    assert result, 'snapshot hung inside a collection'
    # The collection started inside snapshot was measured too (after the copy it read).
    assert result[0]['gc_collections_in_window'] == 1
    assert pauses.snapshot(now_s=1.0)['gc_full_collections_in_window'] >= 1
