"""builtin_interfaces Time and Duration arithmetic, in whole nanoseconds (no float drift in a
stamp): the stamps of a chunk's steps, a command stamped at its image's arrival, and the
time_from_start of trajectory points."""
from __future__ import annotations

from dataclasses import dataclass


def stamp_ns(stamp) -> int:
    """builtin_interfaces/Time `stamp` in whole nanoseconds."""
    return stamp.sec * 1_000_000_000 + stamp.nanosec


def unnormalised_stamp_reason(stamp) -> str | None:
    """Why builtin_interfaces/Time ``stamp`` is malformed (``nanosec`` of a whole second or
    more: the type's contract is below 10^9), or None."""
    if stamp.nanosec >= 1_000_000_000:
        return (f'header stamp nanosec {stamp.nanosec} is not below 10^9 (not a normalised '
                'time: a driver bug)')
    return None


def checked_header_seconds(msg) -> float:
    """A stamped message's header stamp in seconds; ValueError when it is below zero (bad
    input: a driver or clock bug; 0 alone means unstamped and is the caller's to replace by
    the arrival) or not normalised. Robot states and tool poses read it so, as images are
    refused so."""
    malformed = unnormalised_stamp_reason(msg.header.stamp)
    if malformed is not None:
        raise ValueError(malformed)
    stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
    if stamp_s < 0.0:
        raise ValueError(f'header stamp {stamp_s:.3f} s is below zero (0 alone means '
                         'unstamped)')
    return stamp_s


def offset_stamp(stamp, seconds: float):
    """builtin_interfaces/Time `stamp` + `seconds` (>= 0), in whole nanoseconds."""
    total = stamp_ns(stamp) + round(seconds * 1e9)
    return type(stamp)(sec=total // 1_000_000_000, nanosec=total % 1_000_000_000)


def stamp_at(template, seconds: float):
    """A builtin_interfaces/Time of `template`'s type at `seconds` (>= 0) since the epoch, in
    whole nanoseconds."""
    total = round(seconds * 1e9)
    return type(template)(sec=total // 1_000_000_000, nanosec=total % 1_000_000_000)


def point_due(start_s: float, period_s: float, num_points: int, now_s: float) -> int | None:
    """The index of the point a trajectory stamped `start_s`, point k at (k + 1) * period_s,
    is approaching at `now_s`; None before its stamp (sent on a time line the clock has since
    left) or once it has ended."""
    elapsed = now_s - start_s
    if not 0.0 <= elapsed < num_points * period_s:
        return None
    return min(num_points - 1, int(elapsed // period_s))


@dataclass(frozen=True)
class SentTrajectory:
    """A trajectory an output sent (stamped `start_s`, node-clock seconds; point k due
    (k + 1) * `period_s` later), kept for the stop of a hold: `target_at(now_s)` is the point
    it approaches then (the joint and the Cartesian stops). `is_hold`: sent by a hold."""

    start_s: float
    period_s: float
    targets: tuple
    is_hold: bool = False

    def target_at(self, now_s: float):
        index = point_due(self.start_s, self.period_s, len(self.targets), now_s)
        return None if index is None else self.targets[index]


def set_duration(duration, seconds: float) -> None:
    """Writes `seconds` (>= 0) into a builtin_interfaces/Duration, in whole nanoseconds."""
    nanoseconds = round(seconds * 1e9)
    duration.sec = nanoseconds // 1_000_000_000
    duration.nanosec = nanoseconds % 1_000_000_000


__all__ = ['stamp_ns', 'offset_stamp', 'stamp_at', 'point_due', 'SentTrajectory',
           'set_duration']
