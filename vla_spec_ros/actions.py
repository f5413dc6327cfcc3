"""Actions, generic over the families: what a codec's decode returns (``DecodedActions``), a
dataset's statistics and un-normalisation (docs/openvla.md, Action tokens and un-normalisation;
LeRobot's normalisation modes), the ``unnorm_key`` rule, and episodes' actions as chunks.

A family's codec (``action_codec.ActionCodec``: OpenVLA's bins in models/openvla/action_bins.py,
FAST in codecs/fast.py) turns tokens into normalised values; ``ActionStats`` turns those into
robot actions with the dataset's statistics. Plain numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np


class UnnormKeyError(ValueError):
    """unnorm_key missing/unknown for the checkpoint's norm_stats."""


@dataclass(frozen=True)
class DecodedActions:
    normalized: np.ndarray      # float64 (codec.action_shape), NaN where not an action token
    is_valid: bool
    invalid_reason: str | None


# Un-normalisation modes (LeRobot's NormalizationMode names): the range [-1, 1] maps onto the
# named statistics (QUANTILES: OpenVLA's and openpi's q01/q99), or MEAN_STD: x * std + mean.
RANGE_STATS = {'QUANTILES': ('q01', 'q99'), 'MIN_MAX': ('min', 'max'),
               'QUANTILE10': ('q10', 'q90')}
ACTION_MODES = ('QUANTILES', 'MIN_MAX', 'QUANTILE10', 'MEAN_STD', 'IDENTITY')


@dataclass(frozen=True)
class ActionStats:
    """One dataset's action statistics. ``mode`` (norm_stats' ``action.mode``, default
    QUANTILES): a range mode maps [-1, 1] onto [q01, q99] (for MIN_MAX / QUANTILE10 these two
    fields hold min/max or q10/q90); MEAN_STD is LeRobot's ``x * std + mean`` (its
    normalisation divides by ``std + 1e-8``); IDENTITY leaves actions as they are."""

    q01: np.ndarray
    q99: np.ndarray
    mask: np.ndarray            # bool: un-normalise this dimension
    mode: str = 'QUANTILES'
    mean: np.ndarray | None = None
    std: np.ndarray | None = None

    @classmethod
    def from_norm_stats(cls, entry: Mapping, key: str) -> 'ActionStats':
        try:
            action = entry['action']
            mode = action.get('mode', 'QUANTILES')
            if mode not in ACTION_MODES:
                raise ValueError(f'norm_stats[{key!r}]: action mode {mode!r} is not one of '
                                 f'{ACTION_MODES}')
            names = ('mean', 'std') if mode == 'MEAN_STD' else RANGE_STATS.get(mode)
            if names is None:                       # IDENTITY: any statistic gives the size
                dim = len(next(v for k, v in action.items() if k not in ('mode', 'mask')))
                lo = hi = np.zeros(dim)
            else:
                lo, hi = (np.asarray(action[n], dtype=np.float64) for n in names)
            mask = np.asarray(action.get('mask', [True] * len(lo)), dtype=bool)
        except (KeyError, TypeError, StopIteration) as exc:
            raise ValueError(f'norm_stats[{key!r}]: malformed action statistics ({exc!r})') \
                from exc
        if not (lo.shape == hi.shape == mask.shape) or lo.ndim != 1:
            raise ValueError(f'norm_stats[{key!r}]: action statistics/mask shapes differ: '
                             f'{lo.shape}, {hi.shape}, {mask.shape}')
        if mode == 'MEAN_STD':
            return cls(lo, lo, mask, mode, mean=lo, std=hi)
        return cls(lo, hi, mask, mode)

    def normalize(self, actions: np.ndarray) -> np.ndarray:
        """Inverse of ``unnormalize`` for actions (..., D). Range modes clip to [-1, 1]; a
        dimension whose q01 == q99 (e.g. Meta-World's rotation deltas, always 0) maps to 0,
        which ``unnormalize`` turns back into q01. MEAN_STD is LeRobot's ``(a - mean) / (std
        + 1e-8)``, not clipped."""
        a = np.asarray(actions, dtype=np.float64)
        if self.mode == 'IDENTITY':
            return a
        if self.mode == 'MEAN_STD':
            return np.where(self.mask, (a - self.mean) / (self.std + 1e-8), a)
        span = self.q99 - self.q01
        safe_span = np.where(span > 0, span, 1.0)
        scaled = np.where(span > 0, 2.0 * (a - self.q01) / safe_span - 1.0, 0.0)
        return np.clip(np.where(self.mask, scaled, a), -1.0, 1.0)

    def unnormalize(self, normalized: np.ndarray) -> np.ndarray:
        """Range modes: a = 0.5 (x + 1) (q99 - q01) + q01; MEAN_STD: a = x std + mean; where
        mask, else x (e.g. the gripper); x is one step (D,) or a chunk (..., D)."""
        x = np.asarray(normalized, dtype=np.float64)
        if x.ndim < 1 or x.shape[-1] != self.q01.shape[0]:
            raise ValueError(f'action has {x.shape[-1] if x.ndim else 0} dims, statistics '
                             f'have {self.q01.shape[0]}')
        if self.mode == 'IDENTITY':
            return x
        if self.mode == 'MEAN_STD':
            return np.where(self.mask, x * self.std + self.mean, x)
        return np.where(self.mask, 0.5 * (x + 1.0) * (self.q99 - self.q01) + self.q01, x)


def resolve_unnorm_key(norm_stats: Mapping, unnorm_key: str | None) -> str:
    keys = sorted(norm_stats)
    if unnorm_key is None:
        if len(keys) == 1:
            return keys[0]
        raise UnnormKeyError(f'this checkpoint has {len(keys)} datasets in norm_stats; pass '
                             f'unnorm_key, one of {keys}')
    if unnorm_key not in norm_stats:
        raise UnnormKeyError(f'unknown unnorm_key {unnorm_key!r}; available: {keys}')
    return unnorm_key


def chunk_actions(actions: np.ndarray, episode_index: np.ndarray, chunk: int) -> np.ndarray:
    """(N, D) actions in episode order -> (N, chunk, D): each transition's action and the next
    chunk - 1 of its episode, the episode's last action repeated past its end."""
    out = np.empty((len(actions), chunk, actions.shape[1]), dtype=actions.dtype)
    starts = np.flatnonzero(np.r_[True, episode_index[1:] != episode_index[:-1]])
    ends = np.r_[starts[1:], len(actions)]
    for start, end in zip(starts, ends):
        for k in range(chunk):
            rows = np.minimum(np.arange(start, end) + k, end - 1)
            out[start:end, k] = actions[rows]
    return out
