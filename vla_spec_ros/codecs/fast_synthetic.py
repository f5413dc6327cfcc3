"""A small FAST tokenizer fitted on synthetic smooth chunks, for tests and tiny checkpoints.

The published FAST tokenizer cannot be downloaded here, so a tiny random pi0-FAST checkpoint
gets one fitted with the same algorithm (fast_tokenizer.fit_fast_tokenizer) on chunks that
look like robot motion: per dimension a random offset, a linear drift and two low-frequency
cosines, clipped to [-1, 1]. A fixed seed gives the same chunks and the same tokenizer.json.

The fit also sees the two constant chunks -1 and +1. No coefficient of a chunk in [-1, 1] is
larger than sqrt(H) (the orthonormal DCT keeps each dimension's L2 norm), and those two reach
it, so min_token = -round(sqrt(H) scale) and every chunk in [-1, 1] is encodable (a draft
re-encoding any normalised chunk never meets a coefficient below min_token).
"""
from __future__ import annotations

import numpy as np

from .fast_tokenizer import FastTokenizer, fit_fast_tokenizer


def synthetic_action_chunks(num_chunks: int, action_horizon: int, action_dim: int,
                            seed: int = 0) -> np.ndarray:
    """(num_chunks, H, D) smooth normalised chunks in [-1, 1], reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, action_horizon)[None, :, None]               # (1, H, 1)
    shape = (num_chunks, 1, action_dim)
    offset = rng.uniform(-0.6, 0.6, shape)
    drift = rng.uniform(-0.5, 0.5, shape)
    chunks = offset + drift * t
    for _ in range(2):
        frequency = rng.uniform(0.2, 1.5, shape)
        phase = rng.uniform(0.0, 2.0 * np.pi, shape)
        amplitude = rng.uniform(0.0, 0.3, shape)
        chunks = chunks + amplitude * np.cos(2 * np.pi * frequency * t + phase)
    return np.clip(chunks, -1.0, 1.0)


def fit_synthetic_fast_tokenizer(folder=None, *, action_horizon: int = 10, action_dim: int = 7,
                                 num_chunks: int = 400, vocab_size: int = 512,
                                 scale: float = 10.0, seed: int = 0) -> FastTokenizer:
    """A deterministic FAST tokenizer for (action_horizon, action_dim) chunks, saved to
    ``folder`` (tokenizer.json + fast_config.json) when given."""
    chunks = synthetic_action_chunks(num_chunks, action_horizon, action_dim, seed)
    extremes = np.stack([np.full((action_horizon, action_dim), v) for v in (-1.0, 1.0)])
    chunks = np.concatenate([chunks, extremes])
    return fit_fast_tokenizer(chunks, vocab_size=vocab_size, scale=scale, folder=folder)


__all__ = ['fit_synthetic_fast_tokenizer', 'synthetic_action_chunks']
