"""Garbage-collection pauses of the node's process: frozen after load, measured while serving.

A full (generation 2) collection walks every object the collector tracks. With the model, rclpy,
the message types and torch loaded that is about 320,000 objects, and one full collection took
150 ms on one core of our CI machine with the embedded model (``python bench/gc_pause.py``):
a robot would miss about five frames of a 30 Hz camera whenever one ran. CPython starts one when
the objects that survived into generation 2 since the last one reach a quarter of those
already there, so it is rare (none in 90 s of two robots at 30 Hz) but can come back for as
long as the node runs.

``freeze_after_load`` (called by the node once its model is loaded and warmed up) collects
once and then freezes everything that exists (``gc.freeze``): those objects move to a permanent
generation that no collection walks, so a later full collection walks only what was allocated
since. Nothing is lost: the collection just before the freeze frees the garbage there is, and
frozen objects that become garbage later (a model unloaded) are freed after ``unfreeze``, which
the node calls when it unloads its model. ``gc.freeze`` is process-wide: freezes are counted,
and only the last ``unfreeze`` (the last node of the process letting go) returns the objects to
the collector. A second node loading in the same process does pause the first with its own
collection before it freezes.

``GcPauses`` times every collection (``gc.callbacks``, in whichever thread triggered it) so that
/diagnostics reports the longest pause of the last window: a pause shows there even when its
cause is not the node's. Its callback takes no lock: any allocation (in ``snapshot`` itself
too) can start a collection, and a callback that waited for a lock its own thread holds would
hang that thread and leave the collector disabled for good. The events go into a deque
(``append`` is atomic in CPython); ``snapshot`` copies it, retrying when an append lands during
the copy.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import deque

FULL_GENERATION = 2
_COPY_ATTEMPTS = 100

_freeze_lock = threading.Lock()
_num_freezes = 0            # freeze_after_load calls not yet matched by unfreeze


def freeze_after_load() -> int:
    """Collect, then freeze every tracked object; returns how many are frozen (process-wide).
    Each call must be matched by one ``unfreeze``."""
    global _num_freezes
    gc.collect()
    with _freeze_lock:
        gc.freeze()
        _num_freezes += 1
    return gc.get_freeze_count()


def unfreeze() -> None:
    """The matching end of one ``freeze_after_load``: the last one returns the frozen objects
    to the collector (a model unloaded can then be freed). Extra calls do nothing."""
    global _num_freezes
    with _freeze_lock:
        if _num_freezes == 0:
            return
        _num_freezes -= 1
        if _num_freezes == 0:
            gc.unfreeze()


class GcPauses:
    """Every garbage collection's duration, over a sliding window, until ``close``."""

    def __init__(self, window_s: float = 10.0, max_samples: int = 10000,
                 clock=time.monotonic):
        self.window_s = window_s
        self._clock = clock
        self._events: deque = deque(maxlen=max_samples)   # (end time, seconds, generation)
        self._started: dict[int, float] = {}             # thread id -> start of its collection
        gc.callbacks.append(self._on_gc)

    def _on_gc(self, phase: str, info: dict) -> None:
        # No lock here (module docstring); dict and deque updates are atomic in CPython.
        now = self._clock()
        thread = threading.get_ident()
        if phase == 'start':
            self._started[thread] = now
            return
        start = self._started.pop(thread, None)
        if start is not None:
            self._events.append((now, now - start, info.get('generation', -1)))

    def _events_copy(self) -> list:
        for _ in range(_COPY_ATTEMPTS):
            try:
                return list(self._events)
            except RuntimeError:        # an append during the copy (another thread's)
                continue
        return []

    def snapshot(self, now_s: float | None = None) -> dict:
        """Collections in the last ``window_s``: how many, how many full, the longest (ms;
        0 when none ran)."""
        now = self._clock() if now_s is None else now_s
        recent = [(seconds, generation) for end, seconds, generation in self._events_copy()
                  if now - end <= self.window_s]
        return {'gc_collections_in_window': len(recent),
                'gc_full_collections_in_window': sum(g == FULL_GENERATION for _, g in recent),
                'gc_pause_max_ms': 1e3 * max((s for s, _ in recent), default=0.0)}

    def clear(self) -> None:
        """Forget the collections measured so far."""
        self._events.clear()

    def close(self) -> None:
        """Stop measuring (idempotent)."""
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)


__all__ = ['FULL_GENERATION', 'GcPauses', 'freeze_after_load', 'unfreeze']
