"""Whether the node's clock can be trusted to age frames at all (sim time's /clock).

Every age the node judges (an image's, a state's, a chunk step's) is node-clock time. On ROS
time driven by /clock (`use_sim_time: true`) that clock can fail in two ways nothing else
notices:
- **no /clock yet**: the clock reads 0; an unstamped image is received at 0 and is 0 s old,
  its command goes out stamped 0, and since the clock never advances nothing ever goes stale;
- **stopped**: a clock bridge died, a bag ended, a simulator hung or was paused; every age
  stands still, so the last command stands too.

`reason(stall_s)` names either state, or None. It samples the node clock against the
monotonic clock: the clock counts as stopped when it has not moved for `stall_s` seconds of
steady time between two samples, so it is called often (the watchdog's steady timer, every
`watchdog_period`) and the sampling granularity is that period. On the system clock (no
/clock) it always answers None: that clock always runs (its steps are the clock-jump checks').
Thread-safe (the watchdog and the worker both ask).
"""
from __future__ import annotations

import threading
import time

REASON_NO_CLOCK = 'no /clock yet'
REASON_CLOCK_STOPPED = 'node clock stopped'


def steady_clock():
    """A clock for timers that must keep running whatever the node clock does (rclpy's
    STEADY_TIME: monotonic, never stepped, not sim time)."""
    from rclpy.clock import Clock, ClockType
    return Clock(clock_type=ClockType.STEADY_TIME)


class NodeClockWatch:
    def __init__(self, clock, monotonic=time.monotonic):
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._last_ns: int | None = None
        self._last_moved = monotonic()

    def reason(self, stall_s: float) -> str | None:
        """Why the node clock cannot age frames now, or None (see the module docstring)."""
        if not getattr(self._clock, 'ros_time_is_active', False):
            return None
        now_ns = self._clock.now().nanoseconds
        steady = self._monotonic()
        with self._lock:
            if now_ns != self._last_ns:
                self._last_ns, self._last_moved = now_ns, steady
            still_s = steady - self._last_moved
        if now_ns == 0:
            return (f'{REASON_NO_CLOCK}: use_sim_time is true and no clock message has come, '
                    'so no frame can be aged; holding until /clock runs')
        if still_s > stall_s:
            return (f'{REASON_CLOCK_STOPPED}: /clock has not advanced for {still_s:.2f} s '
                    f'(more than max_action_age {stall_s:g} s: a paused or dead simulator, '
                    'clock bridge or bag); holding until it runs again')
        return None


__all__ = ['NodeClockWatch', 'steady_clock', 'REASON_NO_CLOCK', 'REASON_CLOCK_STOPPED']
