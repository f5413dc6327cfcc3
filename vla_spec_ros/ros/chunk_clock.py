"""The thread that publishes a chunked model's steps at their slot starts (docs/chunks.md).

A ROS timer ticks at a fixed phase, but every chunk's slots start at its own image's time, so a
timer at `control_period` would publish each step somewhere inside its slot (or skip one when
two ticks straddle a boundary), and a finer timer costs the executor a callback every few
milliseconds. This thread instead sleeps until the earliest next slot start of any robot (or
until a new chunk arrives, `wake`), then asks each robot's channel to publish what is due. It
never runs in the executor, so image callbacks and diagnostics cannot delay a step.

Times are on the node clock (sim time included): the thread sleeps in wall time, at most
MAX_SLEEP_S at once, and re-reads the node clock on waking, so a step is never published early;
with a sim clock running faster than wall time it is at most MAX_SLEEP_S late.
"""
from __future__ import annotations

import threading

from vla_spec_ros.engine.result import describe_error

MAX_SLEEP_S = 0.05       # longest sleep without re-reading the node clock
IDLE_SLEEP_S = 0.25      # no chunk anywhere: wait this long (or for `wake`)
WAKE_MARGIN_S = 1e-4     # wake just after a slot starts, not just before it


class ChunkClock:
    """Calls `channel.publish_due_step(now)` for every channel at each due time."""

    def __init__(self, node, channels=()):
        self._node = node
        self.channels = list(channels)
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name='vla_spec_steps', daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def wake(self) -> None:
        """A chunk arrived: recompute the next due time now."""
        self._wakeup.set()

    def _now_s(self) -> float:
        return self._node.get_clock().now().nanoseconds * 1e-9

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wakeup.clear()
            try:
                now = self._now_s()
                due = [t for t in (c.publish_due_step(now) for c in self.channels)
                       if t is not None]
            except Exception as exc:      # keep the clock alive; the watchdog still holds
                self._node.get_logger().error(f'chunk clock: {describe_error(exc)}',
                                              throttle_duration_sec=2.0)
                due = []
            if not due:
                self._wakeup.wait(IDLE_SLEEP_S)
                continue
            delay = min(due) - self._now_s() + WAKE_MARGIN_S
            if delay > 0.0:
                self._wakeup.wait(min(delay, MAX_SLEEP_S))


__all__ = ['ChunkClock', 'MAX_SLEEP_S']
