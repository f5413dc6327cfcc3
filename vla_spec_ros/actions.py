"""Action tokens <-> normalised actions <-> robot actions (docs/openvla.md, Action tokens and
un-normalisation).

OpenVLA discretises each normalised action dimension into 256 uniform bins over [-1, 1] and
maps bin k (1..256 from ``digitize``) to token ``V - k`` where ``V = vocab_size -
pad_to_multiple_of`` (32000 for OpenVLA-7B): larger values get smaller ids. Decoding reads
``idx = V - t - 1`` and returns ``bin_centers[idx]`` (255 centres). A token outside the action
range is never clamped into an action: the result is marked invalid instead.

``ActionTokenizer`` is the engine's codec for OpenVLA checkpoints (action_codec.ActionCodec):
a fixed length of ``action_dim`` tokens per frame, one bin each; a chunked checkpoint (``chunk``
K > 1) decodes K control steps per frame, ``K * action_dim`` tokens, step after step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from .action_codec import ActionCodec


class UnnormKeyError(ValueError):
    """unnorm_key missing/unknown for the checkpoint's norm_stats."""


@dataclass(frozen=True)
class DecodedActions:
    normalized: np.ndarray      # float64 (codec.action_shape), NaN where not an action token
    is_valid: bool
    invalid_reason: str | None


class ActionTokenizer(ActionCodec):
    """OpenVLA's bins: ``action_dim`` tokens per control step, one per action dimension;
    ``chunk`` steps per frame (1: OpenVLA's one step, shape (action_dim,); K > 1: shape
    (K, action_dim))."""

    def __init__(self, vocab_size: int, pad_to_multiple_of: int, n_bins: int = 256,
                 action_dim: int = 7, chunk: int = 1):
        if action_dim < 1:
            raise ValueError(f'action_dim: must be >= 1, got {action_dim}')
        if chunk < 1:
            raise ValueError(f'chunk: must be >= 1, got {chunk}')
        self.action_dim, self.chunk = action_dim, chunk
        self.max_tokens = action_dim * chunk
        self.action_shape = (action_dim,) if chunk == 1 else (chunk, action_dim)
        self.text_vocab_size = vocab_size - pad_to_multiple_of     # OpenVLA's V
        if self.text_vocab_size < n_bins:
            raise ValueError(f'vocab_size {vocab_size} - pad_to_multiple_of '
                             f'{pad_to_multiple_of} < n_bins {n_bins}')
        self.n_bins = n_bins
        self.bins = np.linspace(-1.0, 1.0, n_bins)
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0
        self.first_action_id = self.text_vocab_size - n_bins       # bin 255 (value +1)
        self.last_action_id = self.text_vocab_size - 1             # bin 0 (value -1)

    def is_action_token(self, token: int) -> bool:
        return self.first_action_id <= int(token) <= self.last_action_id

    def action_token_range(self) -> tuple[int, int]:
        return self.first_action_id, self.last_action_id

    @property
    def step_tokens(self) -> int:
        return self.action_dim

    def token_to_bin(self, token: int) -> int:
        """Bin index 0..n_bins-1; |bin(a) - bin(b)| == |a - b| for action tokens."""
        if not self.is_action_token(token):
            raise ValueError(f'token {token} is not an action token '
                             f'[{self.first_action_id}, {self.last_action_id}]')
        return self.last_action_id - int(token)

    def encode(self, normalized: Sequence[float]) -> np.ndarray:
        """Normalised actions in [-1, 1] -> token ids (OpenVLA's ``digitize`` convention)."""
        a = np.clip(np.asarray(normalized, dtype=np.float64), -1.0, 1.0)
        return self.text_vocab_size - np.digitize(a, self.bins)

    def decode(self, tokens: Sequence[int]) -> DecodedActions:
        """Tokens (``max_tokens`` of a frame, or one step's ``action_dim``) -> normalised
        values in their step layout: (action_dim,) or (chunk, action_dim)."""
        t = np.asarray(tokens, dtype=np.int64)
        is_action = (t >= self.first_action_id) & (t <= self.last_action_id)
        idx = np.clip(self.text_vocab_size - t - 1, 0, self.n_bins - 2)
        values = np.where(is_action, self.bin_centers[idx], np.nan)
        if self.chunk > 1 and t.size == self.max_tokens:
            values = values.reshape(self.action_shape)
        if is_action.all():
            return DecodedActions(values, True, None)
        bad = [int(x) for x in t[~is_action]]
        return DecodedActions(values, False, f'generated non-action token(s) {bad}')


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
