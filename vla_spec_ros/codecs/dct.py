"""FAST's orthonormal DCT-II and its inverse along time (axis 0), as matrices in numpy.

What ``scipy.fft.dct(x, type=2, norm='ortho', axis=0)`` and ``scipy.fft.idct(...)`` (the
published FAST processor's calls) compute, without scipy: the package's install requirements
do not include it, and a FAST chunk is short (H control steps, tens at most), so one (H, H)
matrix product is as fast as an FFT and simpler::

    C[k, t] = sqrt((1 if k == 0 else 2) / H) * cos(pi k (2t + 1) / (2H))
    dct(x) = C @ x          idct(X) = C.T @ X       (C is orthogonal: C.T = C^-1)

Both are the exact transforms up to float64 rounding (a few ulp, as scipy's; the two agree
to ~1e-15 and round to the same integer coefficients: test/test_fast_dct.py). The cosine's
argument is reduced modulo 2 pi in integers first (k (2t + 1) mod 4H), so no large angle
loses precision.
"""
from __future__ import annotations

import functools
import math

import numpy as np


@functools.lru_cache(maxsize=32)
def dct_matrix(n: int) -> np.ndarray:
    """The orthonormal DCT-II matrix C (n, n), float64, read-only (module docstring)."""
    if n < 1:
        raise ValueError(f'n: the DCT needs at least one sample, got {n}')
    k, t = np.arange(n)[:, None], np.arange(n)[None, :]
    phase = (k * (2 * t + 1)) % (4 * n)                 # the angle in units of pi / (2n)
    weight = np.where(k == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n))
    matrix = weight * np.cos(np.pi * phase / (2 * n))
    matrix.setflags(write=False)
    return matrix


def dct(x: np.ndarray) -> np.ndarray:
    """Orthonormal DCT-II of ``x`` (H, ...) along axis 0 (float64)."""
    x = np.asarray(x, dtype=np.float64)
    return np.tensordot(dct_matrix(x.shape[0]), x, axes=(1, 0))


def idct(coefficients: np.ndarray) -> np.ndarray:
    """Inverse of ``dct`` (orthonormal DCT-III) along axis 0 (float64)."""
    coefficients = np.asarray(coefficients, dtype=np.float64)
    return np.tensordot(dct_matrix(coefficients.shape[0]).T, coefficients, axes=(1, 0))


__all__ = ['dct', 'dct_matrix', 'idct']
