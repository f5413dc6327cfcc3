"""builtin_interfaces Time and Duration arithmetic, in whole nanoseconds (no float drift in a
stamp): the stamps of a chunk's steps, a command stamped at its image's arrival, and the
time_from_start of trajectory points."""
from __future__ import annotations


def offset_stamp(stamp, seconds: float):
    """builtin_interfaces/Time `stamp` + `seconds` (>= 0), in whole nanoseconds."""
    total = stamp.sec * 1_000_000_000 + stamp.nanosec + round(seconds * 1e9)
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


def set_duration(duration, seconds: float) -> None:
    """Writes `seconds` (>= 0) into a builtin_interfaces/Duration, in whole nanoseconds."""
    nanoseconds = round(seconds * 1e9)
    duration.sec = nanoseconds // 1_000_000_000
    duration.nanosec = nanoseconds % 1_000_000_000


__all__ = ['offset_stamp', 'stamp_at', 'point_due', 'set_duration']
