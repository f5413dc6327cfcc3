"""OpenVLA's action codec: 256 uniform bins per action dimension (docs/openvla.md, Action
tokens).

OpenVLA discretises each normalised action dimension into 256 uniform bins over [-1, 1] and
maps bin k (1..256 from ``digitize``) to token ``V - k`` where ``V = vocab_size -
pad_to_multiple_of`` (32000 for OpenVLA-7B): larger values get smaller ids. Decoding reads
``idx = V - t - 1`` and returns ``bin_centers[idx]`` (255 centres). A token outside the action
range is never clamped into an action: the result is marked invalid instead.

``ActionTokenizer`` (OpenVLA's own name for it) is the engine's codec for OpenVLA checkpoints
(action_codec.ActionCodec): a fixed length of ``action_dim`` tokens per frame, one bin each; a
chunked checkpoint (``chunk`` K > 1) decodes K control steps per frame, ``K * action_dim``
tokens, step after step. Un-normalisation is generic (``actions.ActionStats``). Plain numpy.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ...action_codec import ActionCodec
from ...actions import DecodedActions


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
