"""FAST's DCT without scipy (codecs/dct.py) against scipy.fft, the published processor's call:
the same transform to float64 rounding, and the same integer coefficients after FAST's
rounding on many chunks (so tokens fitted or encoded with scipy read the same here). Skipped
where scipy is not installed (it is a test dependency only)."""
import math

import numpy as np
import pytest

from vla_spec_ros.codecs.dct import dct, dct_matrix, idct
from vla_spec_ros.codecs.fast_synthetic import synthetic_action_chunks
from vla_spec_ros.codecs.fast_tokenizer import chunk_to_coefficients

scipy_fft = pytest.importorskip('scipy.fft')


def test_the_matrix_is_the_orthonormal_dct_ii_of_its_definition():
    n = 6

    def entry(k, t):
        return math.sqrt((1 if k == 0 else 2) / n) * math.cos(math.pi * k * (2 * t + 1) / (2 * n))
    expected = [[entry(k, t) for t in range(n)] for k in range(n)]
    np.testing.assert_allclose(dct_matrix(n), expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(dct_matrix(n) @ dct_matrix(n).T, np.eye(n), rtol=0, atol=1e-14)
    with pytest.raises(ValueError, match='n:'):
        dct_matrix(0)


@pytest.mark.parametrize('horizon, dim', [(1, 1), (2, 3), (4, 3), (8, 7), (10, 7), (50, 14)])
def test_dct_and_idct_equal_scipys_to_rounding(horizon, dim):
    x = np.random.default_rng(horizon * 100 + dim).uniform(-1, 1, (horizon, dim))
    expected = scipy_fft.dct(x, type=2, norm='ortho', axis=0)
    np.testing.assert_allclose(dct(x), expected, rtol=0, atol=1e-14)
    np.testing.assert_allclose(idct(expected), scipy_fft.idct(expected, type=2, norm='ortho',
                                                              axis=0), rtol=0, atol=1e-14)
    np.testing.assert_allclose(idct(dct(x)), x, rtol=0, atol=1e-14)


@pytest.mark.parametrize('horizon, dim, scale', [(4, 3, 10.0), (8, 7, 10.0), (10, 7, 10.0),
                                                 (10, 7, 100.0), (50, 7, 10.0)])
def test_fast_rounds_to_scipys_coefficients(horizon, dim, scale):
    """Random and smooth chunks: every integer coefficient equals scipy's."""
    rng = np.random.default_rng(7)
    chunks = np.concatenate([rng.uniform(-1, 1, (2000, horizon, dim)),
                             synthetic_action_chunks(2000, horizon, dim, seed=11)])
    ours = np.stack([chunk_to_coefficients(c, scale) for c in chunks])
    reference = np.rint(scipy_fft.dct(chunks, type=2, norm='ortho', axis=1) * scale)
    assert np.array_equal(ours, reference.astype(np.int64).reshape(len(chunks), -1))
