"""What the node remembers about one observation, and the depth-1 slot it waits in.

Pure Python (no rclpy): the worker takes the newest observation of each robot from its
`LatestFrameSlot`; an older one not yet taken is replaced (latest wins, counted as dropped).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class FrameInfo:
    """What the node remembers about one observation; travels as Frame.user_data.

    With several image slots, `stamp` / `stamp_s` are the first slot's (the set's anchor,
    observation_sync.py); `receipt_mono` is its earliest image's arrival (its latency counts
    from there), and `receipt_s` / `receipt_stamp` that too with ``stamp_source: receipt``
    (a set a lagging slot completes late is as old as its oldest image), else the anchor's
    own arrival (the bound no stamp of its can be later than: command_rules.aged_from)."""

    stamp: object           # builtin_interfaces/Time of the image header (node clock if zero)
    stamp_s: float          # header stamp in seconds, 0.0 when the driver did not stamp
    receipt_s: float        # node clock at receipt
    receipt_mono: float     # time.monotonic() at receipt, for latency
    # time.monotonic() when the worker took the frame and when it had converted it (NaN until
    # then): where the frame's time went (diagnostics.FRAME_STAGES)
    taken_mono: float = float('nan')
    converted_mono: float = float('nan')
    # receipt_s as a builtin_interfaces/Time, exact (a command stamped with the arrival:
    # command_rules.command_stamp); None when not known (then built from receipt_s)
    receipt_stamp: object = None


@dataclass(frozen=True)
class Observation:
    """What waits in a robot's slot for the worker: one image message per image slot (slot
    order), its FrameInfo, the values of the robot's paired inputs read at its time
    (`inputs`, by adapter key: input_adapter.py), and, when the observation may not be
    answered, why: `error` with `is_bad_input` (refused: bad input, out of sync) or not (a
    stale input: a hold)."""

    messages: tuple
    info: FrameInfo
    inputs: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None
    is_bad_input: bool = False

    @property
    def state(self):
        """The robot state paired with the images (np.ndarray (n,) float64), or None."""
        return self.inputs.get('state')


class LatestFrameSlot:
    """A queue of depth 1: `put` replaces an item the worker has not taken yet.

    `wakeup` (optional, shared by every robot's slot) is set on each put, so one worker can
    wait for the first frame of any robot."""

    def __init__(self, wakeup: threading.Event | None = None):
        self._cond = threading.Condition()
        self._item = None
        self._wakeup = wakeup

    def put(self, item) -> bool:
        """Store `item`; True when it replaced (dropped) an untaken one."""
        with self._cond:
            replaced = self._item is not None
            self._item = item
            self._cond.notify()
        if self._wakeup is not None:
            self._wakeup.set()
        return replaced

    def take(self, timeout: float = 0.0):
        """The item, or None after `timeout` seconds (0 = do not wait)."""
        with self._cond:
            if self._item is None and timeout > 0:
                self._cond.wait(timeout)
            item, self._item = self._item, None
        return item

    def clear(self) -> int:
        with self._cond:
            had = self._item is not None
            self._item = None
        return int(had)


__all__ = ['FrameInfo', 'Observation', 'LatestFrameSlot']
