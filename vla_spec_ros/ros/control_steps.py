"""Which control step each image of a robot was taken at (Frame.control_step), for a chunked
model's temporal drafting: the engine shifts the previous chunk by the steps between the two
images (engine/drafting/shifted_chunk_drafter.py).

Counted from one image to the next, not from the clock's zero: step = the previous image's step +
round(elapsed / control_period). Rounding the absolute time (round(t / control_period)) puts
every image at the same fraction of a period; a camera whose images fall near half a period
would then see its stamp jitter turn consecutive images into 0 or 2 steps apart, and each such
frame drafts the wrong shift (a slower frame, never another token: r = 0 decides AR's tokens
whatever the draft). Counted from image to image, a jitter below half a period never changes a
step; a dropped frame still counts its two periods. A clock that jumps back (a simulator reset)
counts back too: the engine forgot the robot's chunks with the jump (robot_channel.py), so no
draft is shifted across it.

Plain Python (no rclpy): one instance per robot, called by the inference worker only.
"""
from __future__ import annotations

import math


class ControlSteps:
    """The step of each image of one robot, in the order the worker takes them."""

    def __init__(self):
        self._last: tuple[float, int, float] | None = None     # (time s, step, period s)

    def step_at(self, time_s: float, period_s: float) -> int:
        """The control step of an image taken at `time_s` (seconds, the robot's stamps).
        The first image, one after a change of `period_s` and one whose time is not finite
        take round(time_s / period_s)."""
        if not (period_s > 0.0 and math.isfinite(period_s)):
            raise ValueError(f'control_period: expected a positive period, got {period_s!r}')
        last = self._last
        if last is None or last[2] != period_s or not math.isfinite(time_s):
            step = round(time_s / period_s) if math.isfinite(time_s) else 0
        else:
            step = last[1] + round((time_s - last[0]) / period_s)
        if math.isfinite(time_s):
            self._last = (time_s, step, period_s)
        return step


__all__ = ['ControlSteps']
