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
    def from_norm_stats(cls, entry: Mapping, key: str, action_dim: int | None = None,
                        source: str | None = None) -> 'ActionStats':
        """One norm_stats entry (``{"action": {...}}``), checked: the mode's statistics are
        finite, each low end at most its high end (a std at least 0), the mask holds real
        booleans, and, given ``action_dim`` (the model's), there are that many dimensions.
        ValueError naming ``source`` (the file they came from), the key and what is wrong:
        statistics that pass would otherwise mirror, silence or fail every action at run
        time."""
        where = f'{source}: norm_stats[{key!r}]' if source else f'norm_stats[{key!r}]'
        mode, lo, hi, mask = _action_fields(entry, where)
        _check_statistics(mode, lo, hi, mask, where, action_dim)
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


def _action_fields(entry: Mapping, where: str) -> tuple:
    """(mode, low/mean, high/std, mask) of an entry as arrays; ValueError when malformed."""
    action = entry.get('action') if isinstance(entry, Mapping) else None
    if not isinstance(action, Mapping):
        raise ValueError(f'{where}: malformed action statistics (expected {{"action": '
                         f'{{...}}}}, got {type(entry).__name__} {_short(entry)})')
    mode = action.get('mode', 'QUANTILES')
    if mode not in ACTION_MODES:
        raise ValueError(f'{where}: action mode {mode!r} is not one of {ACTION_MODES}')
    try:
        lo, hi = _mode_values(action, mode)
    except (KeyError, TypeError, ValueError, StopIteration) as exc:
        raise ValueError(f'{where}: malformed action statistics ({exc!r})') from exc
    return mode, lo, hi, _mask(action.get('mask'), lo.size, where)


def _mode_values(action: Mapping, mode: str) -> tuple[np.ndarray, np.ndarray]:
    names = ('mean', 'std') if mode == 'MEAN_STD' else RANGE_STATS.get(mode)
    if names is None:                       # IDENTITY: any statistic gives the size
        dim = len(next(v for k, v in action.items() if k not in ('mode', 'mask')))
        return np.zeros(dim), np.zeros(dim)
    return tuple(np.asarray(action[n], dtype=np.float64) for n in names)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + '...'


def _mask(values, dim: int, where: str) -> np.ndarray:
    """The mask as bools: JSON true/false only (a string such as "no" is not False)."""
    if values is None:
        return np.ones(dim, dtype=bool)
    items = list(values) if isinstance(values, (list, tuple, np.ndarray)) else None
    if items is None or not all(isinstance(v, (bool, np.bool_)) for v in items):
        raise ValueError(f'{where}: action mask must be a list of true/false, got {values!r}')
    return np.asarray(items, dtype=bool)


def _check_statistics(mode: str, lo: np.ndarray, hi: np.ndarray, mask: np.ndarray,
                      where: str, action_dim: int | None) -> None:
    if not (lo.shape == hi.shape == mask.shape) or lo.ndim != 1:
        raise ValueError(f'{where}: action statistics/mask shapes differ: '
                         f'{lo.shape}, {hi.shape}, {mask.shape}')
    if action_dim is not None and lo.shape[0] != action_dim:
        raise ValueError(f'{where}: action statistics of {lo.shape[0]} dims; the model\'s '
                         f'actions have {action_dim}')
    if mode == 'IDENTITY':
        return
    low, high = ('mean', 'std') if mode == 'MEAN_STD' else RANGE_STATS[mode]
    for name, values in ((low, lo), (high, hi)):
        if not np.isfinite(values).all():
            raise ValueError(f'{where}: action {name} is not finite at dims '
                             f'{np.flatnonzero(~np.isfinite(values)).tolist()}')
    # MEAN_STD's std must not be negative; a range's low end must not pass its high end (a
    # swapped pair mirrors every action). Equal ends are fine (a dimension that never moves).
    bad = np.flatnonzero(hi < 0) if mode == 'MEAN_STD' else np.flatnonzero(lo > hi)
    if bad.size:
        rule = 'action std < 0' if mode == 'MEAN_STD' else f'action {low} > {high}'
        raise ValueError(f'{where}: {rule} at dims {bad.tolist()}')


def stats_by_key(norm_stats: Mapping, action_dim: int | None = None,
                 source: str | None = None) -> dict[str, ActionStats]:
    """Every dataset's ``ActionStats`` of a checkpoint's norm_stats, checked as
    ``ActionStats.from_norm_stats`` checks one (``source``: the file, for errors)."""
    if not isinstance(norm_stats, Mapping):
        raise ValueError(f'{source or "norm_stats"}: expected an object of datasets, got '
                         f'{type(norm_stats).__name__}')
    return {key: ActionStats.from_norm_stats(entry, key, action_dim, source)
            for key, entry in norm_stats.items()}


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
