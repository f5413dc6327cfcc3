"""What the engine returns for one frame: tokens, normalised and robot actions, stats."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ActionResult:
    """One decided action.

    tokens:     the generated token ids (OpenVLA's bins: ``action_dim`` of them)
    normalized: float64 (codec.action_shape, e.g. (action_dim,)) in [-1, 1]; NaN where a token
                is not an action token
    action:     float64, the same shape, un-normalised with the dataset's q01/q99 (EEF_POS:
                dx, dy, dz in m, droll, dpitch, dyaw in rad, gripper 1 = open, 0 = closed)
    is_valid:   False when a token is not an action token or a value is not finite; such a
                result must never be executed (the ROS node publishes zero motion instead)
    stats:      forward_passes, accepted_lengths, latency_s, unnorm_key, mode, ...
    reasoning:  what a reasoning policy wrote before its action, as its family reads it (ECoT:
                ``models/ecot/reasoning_text.Reasoning``: text, fields, ...); None for a
                policy whose output is the action alone
    """

    tokens: tuple
    normalized: np.ndarray
    action: np.ndarray
    is_valid: bool
    invalid_reason: str | None = None
    stats: dict = field(default_factory=dict)
    reasoning: Any = None


@dataclass(frozen=True)
class Frame:
    """One observation submitted to the streaming engine.

    ``image`` is one (H, W, 3) uint8 RGB array for a one-camera model, or a tuple of them, one
    per image slot of the model in the model's slot order (``images`` gives the tuple either
    way). ``state`` is the robot's state vector (float, e.g. joint positions in the order the
    model was trained with) for a family that reads one, else None.
    """

    image: np.ndarray | tuple   # (H, W, 3) uint8 RGB, or one per image slot
    instruction: str
    unnorm_key: str | None = None
    stream_id: str = 'default'
    user_data: Any = None       # returned untouched with the result (e.g. the image stamp)
    # The control step the image was taken at (the node: its stamp / control_period), when
    # known: temporal drafting of a chunked model shifts the previous chunk by the steps
    # between two frames.
    control_step: int | None = None
    state: np.ndarray | None = None

    @property
    def images(self) -> tuple:
        """The frame's images, one per image slot (a one-camera frame: a 1-tuple)."""
        return tuple(self.image) if isinstance(self.image, (tuple, list)) else (self.image,)


def describe_error(exc: BaseException) -> str:
    """How an error is reported in results, logs and diagnostics: ``Type: message``."""
    return f'{type(exc).__name__}: {exc}'


@dataclass(frozen=True)
class FinishedAction:
    request_id: int
    frame: Frame
    result: ActionResult | None     # None when ``error`` is set
    error: str | None = None
