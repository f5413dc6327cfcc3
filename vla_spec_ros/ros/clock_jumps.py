"""Noticing the node clock go backwards (pure Python: no rclpy).

A robot's frame order (observation_sync.py), its newest observation and its running chunks are
all kept on the node clock. When that clock goes back (a simulator reset under `use_sim_time`,
`ros2 bag play --clock` started again from the bag's beginning, a step of the system clock),
every frame after it is stamped before the ones already received: kept order would drop them
all until the clock caught up with where it was, possibly for ever.

The rule: the robot reads the node clock at every image it receives and at every watchdog tick,
and always under one lock, so two readings are compared in the order they were taken. A reading
earlier than the latest one before it is a jump backwards, whatever its size (a clock that
only moves forwards never gives one). The caller then forgets what it kept on the old time
line (robot_channel.py: the robot is reset as by `~/reset`) and says so in the log.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClockJump:
    """The node clock went from `from_s` back to `to_s` (seconds, to_s < from_s)."""

    from_s: float
    to_s: float

    @property
    def back_s(self) -> float:
        return self.from_s - self.to_s

    def describe(self) -> str:
        return (f'the node clock went back {self.back_s:.3f} s ({self.from_s:.3f} s -> '
                f'{self.to_s:.3f} s: a simulator reset, a bag played again from its start?)')


class ClockWatch:
    """The latest node clock reading of one robot; `check(now_s)` under the caller's lock."""

    def __init__(self):
        self._latest_s: float | None = None

    def check(self, now_s: float) -> ClockJump | None:
        """A ClockJump when `now_s` is earlier than the latest reading before it, else None;
        `now_s` is the latest reading after the call either way."""
        latest, self._latest_s = self._latest_s, now_s
        if latest is not None and now_s < latest:
            return ClockJump(latest, now_s)
        return None


__all__ = ['ClockJump', 'ClockWatch']
