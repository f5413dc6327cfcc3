"""Training stops at the first step whose loss or gradient is not finite.

An optimizer step on a NaN or infinite gradient writes NaN into every weight it touches, and
every later step keeps them there: a run that went on would end with a checkpoint of NaN
weights and exit 0. The check sits between the gradient's clipping (whose global norm it reads:
under DDP the norm is of the all-reduced gradient, so every rank stops at the same step) and
the optimizer step, so the weights are still the last finite ones and nothing after it, the
final checkpoint included, is written.
"""
from __future__ import annotations

import math


class TrainingDiverged(RuntimeError):
    """A training step's loss or gradient norm is NaN or infinite."""


def check_finite_step(step: int, loss: float, grad_norm) -> None:
    """TrainingDiverged naming ``step`` (counted from 1) unless ``loss`` and ``grad_norm`` (a
    number or a 0-dim tensor, clip_grad_norm_'s result) are finite."""
    loss, grad_norm = float(loss), float(grad_norm)
    if math.isfinite(loss) and math.isfinite(grad_norm):
        return
    raise TrainingDiverged(f'step {step}: the loss is {loss} and the gradient norm {grad_norm}: '
                           'training diverged and stopped before this step changed the weights; '
                           'nothing more is written (try a smaller --lr or --grad-clip)')


__all__ = ['TrainingDiverged', 'check_finite_step']
