"""The thread that publishes a chunked model's steps at their slot starts (docs/chunks.md).

A ROS timer ticks at a fixed phase, but every chunk's slots start at its own image's time, so a
timer at `control_period` would publish each step somewhere inside its slot (or skip one when
two ticks straddle a boundary), and a finer timer costs the executor a callback every few
milliseconds. This thread instead sleeps until the earliest next slot start of any robot (or
until a new chunk arrives, `wake`), then asks each robot's channel to publish what is due. It
never runs in the executor, so image callbacks and diagnostics cannot delay a step.

Times are on the node clock, and the thread re-reads it on every waking, so a step is never
published early. How long it sleeps depends on what drives that clock:
  - the wall clock (no sim time): the delay to the next slot start, at most MAX_SLEEP_S at
    once;
  - ROS time driven by /clock (`use_sim_time`): simulated time may run at any rate against the
    wall clock (a fast simulator, `ros2 bag play -r 8`, a paused simulator), so a delay on the
    node clock says nothing of the wall time to sleep: slept on the wall clock, 50 ms are
    400 ms of a simulation at 8x, and whole steps were skipped. The thread instead sleeps in
    slices of SIM_SLICE_S wall seconds, re-reading the node clock after each, until the slot
    starts: a step is then late by at most one slice plus the thread's scheduling delay in
    wall time, that many times the simulation's rate in simulated time (the slice alone: 8 ms
    at 4x, 16 ms at 8x). The node clock itself moves only when a /clock message arrives (a
    simulator publishing /clock at 10 Hz moves it in steps of 0.1 s).
`wake` (a new chunk) and `stop` interrupt any sleep at once.
"""
from __future__ import annotations

import threading
import time

from vla_spec_ros.engine.result import describe_error

MAX_SLEEP_S = 0.05       # longest sleep without asking the channels what is due
# On sim time: the longest wall sleep without re-reading the node clock. Short, since at a
# simulation rate r it is r times as long in simulated time (a step skipped once it passes a
# control period). Polling every 2 ms while a chunk is running costs about 1% of a core
# (measured: rclpy ROSClock.now() and the wait, 3 s on the 2-core development machine).
SIM_SLICE_S = 0.002
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

    def _is_sim_time(self) -> bool:
        """Whether the node clock is ROS time driven by /clock (`use_sim_time`), read at every
        sleep: the parameter may change while the node runs. (A node's clock is an rclpy
        ROSClock; any other clock is taken for the wall clock.)"""
        return bool(getattr(self._node.get_clock(), 'ros_time_is_active', False))

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wakeup.clear()
            due = [t for t in (self._step_of(c, self._now_s()) for c in self.channels)
                   if t is not None]
            if not due:
                self._wakeup.wait(IDLE_SLEEP_S)
                continue
            self._sleep_until(min(due) + WAKE_MARGIN_S)

    def _step_of(self, channel, now_s: float) -> float | None:
        """One robot's due step (`publish_due_step`), its failure kept to that robot: the
        clock stays alive and the other robots' steps still go out this round (the
        watchdog still holds the failed robot when its commands stop)."""
        try:
            return channel.publish_due_step(now_s)
        except Exception as exc:
            self._node.get_logger().error(
                f'chunk clock: {getattr(channel, "label", "a robot")}: {describe_error(exc)}',
                throttle_duration_sec=2.0)
            return None

    def _sleep_until(self, wake_s: float) -> None:
        """Sleep until the node clock reaches `wake_s`, `wake` or `stop` is called, or
        MAX_SLEEP_S wall seconds have passed, whichever comes first (module docstring)."""
        if not self._is_sim_time():
            delay = wake_s - self._now_s()
            if delay > 0.0:
                self._wakeup.wait(min(delay, MAX_SLEEP_S))
            return
        wall_end = time.monotonic() + MAX_SLEEP_S
        while time.monotonic() < wall_end:
            remaining_s = wake_s - self._now_s()
            if remaining_s <= 0.0:
                return
            # Up to a rate of 1, `remaining_s` wall seconds never pass the slot's start: the
            # last slice is cut to it, so a step is as punctual as on the wall clock.
            if self._wakeup.wait(min(remaining_s, SIM_SLICE_S)):
                return


__all__ = ['ChunkClock', 'MAX_SLEEP_S', 'SIM_SLICE_S']
