"""FAST's transform and BPE (codecs/fast_tokenizer.py) against independent definitions: a
hand-built DCT-II matrix, scipy's IDCT called directly, hand-computed coefficients, the
published pipeline's components (tokenizers' ByteLevelBPETokenizer), a saved and reloaded
tokenizer, and a fit repeated in a fresh process."""
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import scipy.fft

from vla_spec_ros.codecs.fast_synthetic import (fit_synthetic_fast_tokenizer,
                                                synthetic_action_chunks)
from vla_spec_ros.codecs.fast_tokenizer import (FastDecodeError, FastParams, FastTokenizer,
                                                chunk_to_coefficients, coefficients_to_chunk,
                                                coefficients_to_text, fit_fast_tokenizer)

H, D = 10, 7


def dct_matrix(n):
    """Orthonormal DCT-II as a matrix, from its definition: C[k, t] = sqrt((1 or 2) / n)
    cos(pi (2t + 1) k / (2n)); the inverse is its transpose."""
    k, t = np.arange(n)[:, None], np.arange(n)[None, :]
    weight = np.where(k == 0, math.sqrt(1.0 / n), math.sqrt(2.0 / n))
    return weight * np.cos(np.pi * (2 * t + 1) * k / (2 * n))


@pytest.fixture(scope='module')
def tokenizer():
    return fit_synthetic_fast_tokenizer(action_horizon=H, action_dim=D)


@pytest.fixture(scope='module')
def wide_tokenizer():
    """Scale 100: integers past 127, i.e. two-byte characters in the byte-level BPE."""
    return fit_synthetic_fast_tokenizer(action_horizon=8, action_dim=2, scale=100.0,
                                        vocab_size=1500, num_chunks=300)


def test_coefficients_of_a_hand_computed_chunk():
    # H = 2: c0 = (x0 + x1) / sqrt(2), c1 = (x0 - x1) / sqrt(2), per dimension.
    chunk = np.array([[0.3, -0.2], [0.1, 0.4]])
    # x 10: dim 0: 2.83 -> 3, 1.41 -> 1; dim 1: 1.41 -> 1, -4.24 -> -4; frequency-major.
    assert chunk_to_coefficients(chunk, 10.0).tolist() == [3, 1, 1, -4]


def test_rounding_is_half_to_even(monkeypatch):
    # The DCT is not exact to the last bit, so the rounding stage is checked alone: with
    # the DCT replaced by the identity, exact halves go to the even neighbour.
    from vla_spec_ros.codecs import fast_tokenizer
    monkeypatch.setattr(fast_tokenizer, 'dct', lambda x, **kwargs: x)
    chunk = np.array([[2.5, 3.5, -2.5, 0.5, -1.5]])
    assert chunk_to_coefficients(chunk, 1.0).tolist() == [2, 4, -2, 0, -2]


def test_transform_matches_the_dct_matrix_and_scipys_idct():
    rng = np.random.default_rng(0)
    chunk = rng.uniform(-1, 1, (H, D))
    q = chunk_to_coefficients(chunk, 10.0)
    c = dct_matrix(H)
    expected = np.rint(c @ chunk * 10.0).astype(int)       # (H, D): row k = frequency k
    assert q.tolist() == expected.reshape(-1).tolist()
    assert q.tolist() == [int(expected[k, d]) for k in range(H) for d in range(D)]
    decoded = coefficients_to_chunk(q, H, D, 10.0)
    direct = scipy.fft.idct(q.reshape(H, D) / 10.0, type=2, norm='ortho', axis=0)
    # The codec's IDCT is a matrix product (codecs/dct.py), scipy's an FFT: equal to rounding.
    np.testing.assert_allclose(decoded, direct, rtol=0, atol=1e-14)
    np.testing.assert_allclose(decoded, c.T @ (q.reshape(H, D) / 10.0), atol=1e-12)


def test_round_trip_within_one_quantisation_step(tokenizer):
    p = tokenizer.params
    scale = p.scale
    per_dim_bound = 0.5 * math.sqrt(H) / scale      # each coefficient off by <= 0.5 / scale
    assert p.max_error_l2 == pytest.approx(0.5 * math.sqrt(H * D) / scale)
    chunks = synthetic_action_chunks(200, H, D, seed=123)    # not the fitting data
    for chunk in chunks:
        ids = tokenizer.encode(chunk)
        decoded = tokenizer.decode(ids)
        assert decoded.shape == (H, D)
        # The BPE is lossless: the decoded chunk is exactly the rounded coefficients' IDCT.
        rounded = np.rint(dct_matrix(H) @ chunk * scale)
        np.testing.assert_allclose(decoded, dct_matrix(H).T @ rounded / scale, atol=1e-12)
        assert np.linalg.norm(decoded - chunk) <= p.max_error_l2
        assert (np.linalg.norm(decoded - chunk, axis=0) <= per_dim_bound + 1e-12).all()
        assert len(ids) < H * D                     # smooth chunks compress


def test_the_bound_is_reached_in_the_limit():
    """The bound is not loose by construction: coefficients all at k + 0.5 - eps lose almost
    0.5 / scale each."""
    scale = 10.0
    c = np.full((H, D), 0.0499)                     # x 10 = 0.499 -> 0
    chunk = dct_matrix(H).T @ c
    decoded = coefficients_to_chunk(chunk_to_coefficients(chunk, scale), H, D, scale)
    error = np.linalg.norm(decoded - chunk)
    assert 0.99 * 0.5 * math.sqrt(H * D) / scale < error <= 0.5 * math.sqrt(H * D) / scale


def test_saved_and_reloaded_tokenizer_encodes_identically(tokenizer, tmp_path):
    tokenizer.save(tmp_path)
    assert json.loads((tmp_path / 'fast_config.json').read_text()) == {
        'scale': 10.0, 'min_token': tokenizer.params.min_token, 'action_horizon': H,
        'action_dim': D, 'vocab_size': 512}
    loaded = FastTokenizer.load(tmp_path)
    assert loaded.params == tokenizer.params and loaded.num_ids == tokenizer.num_ids
    assert loaded.bpe.to_str() == tokenizer.bpe.to_str()
    for chunk in synthetic_action_chunks(50, H, D, seed=7):
        ids = tokenizer.encode(chunk)
        assert loaded.encode(chunk) == ids
        assert np.array_equal(loaded.decode(ids), tokenizer.decode(ids))


def test_fitting_is_deterministic_across_processes(tokenizer):
    code = ('from vla_spec_ros.codecs.fast_synthetic import fit_synthetic_fast_tokenizer as f; '
            f'print(f(action_horizon={H}, action_dim={D}).bpe.to_str())')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == tokenizer.bpe.to_str()


def test_the_pipeline_is_the_published_byte_level_bpe(tokenizer):
    from tokenizers import ByteLevelBPETokenizer
    ours = json.loads(tokenizer.bpe.to_str())
    published = json.loads(ByteLevelBPETokenizer()._tokenizer.to_str())
    for part in ('normalizer', 'pre_tokenizer', 'decoder', 'added_tokens'):
        assert ours[part] == published[part], part
    assert ours['post_processor']['type'] == published['post_processor']['type']
    assert ours['model']['type'] == 'BPE' and ours['model']['unk_token'] is None


def test_the_published_processor_config_loads(tokenizer, tmp_path):
    tokenizer.bpe.save(str(tmp_path / 'tokenizer.json'))
    (tmp_path / 'processor_config.json').write_text(json.dumps({
        'processor_class': 'UniversalActionProcessor', 'scale': 10,
        'min_token': tokenizer.params.min_token, 'time_horizon': None, 'action_dim': None,
        'vocab_size': 512}))
    with pytest.raises(ValueError, match='action_horizon'):
        FastTokenizer.load(tmp_path)
    loaded = FastTokenizer.load(tmp_path, action_horizon=H, action_dim=D)
    chunk = synthetic_action_chunks(1, H, D, seed=3)[0]
    assert loaded.encode(chunk) == tokenizer.encode(chunk)
    (tmp_path / 'fast_config.json').write_text(json.dumps({
        'scale': 10.0, 'min_token': -3, 'action_horizon': H, 'action_dim': D,
        'vocab_size': 512}))
    with pytest.raises(ValueError, match='action_dim: 6 given'):
        FastTokenizer.load(tmp_path, action_dim=6)
    (tmp_path / 'fast_config.json').write_text(json.dumps({'scale': 10.0, 'scael': 1}))
    with pytest.raises(ValueError, match='unknown key'):
        FastTokenizer.load(tmp_path)


def test_malformed_id_sequences_are_refused(tokenizer):
    chunk = synthetic_action_chunks(1, H, D, seed=11)[0]
    ids = tokenizer.encode(chunk)
    cases = {'no FAST tokens': [],
             'decode to': ids[:-1],                              # one token short
             'outside the vocabulary': ids[:3] + [tokenizer.num_ids] + ids[3:]}
    for reason, bad in cases.items():
        with pytest.raises(FastDecodeError, match=reason):
            tokenizer.decode(bad)
    with pytest.raises(FastDecodeError, match='decode to'):
        tokenizer.decode(ids + ids[-1:])                         # one token too many


def test_a_partial_character_is_refused(wide_tokenizer):
    tok = wide_tokenizer
    assert tok.params.scale == 100.0
    chunk = synthetic_action_chunks(1, 8, 2, seed=5)[0]
    ids = tok.encode(chunk)
    text = coefficients_to_text(chunk_to_coefficients(chunk, 100.0), tok.params.min_token)
    assert max(map(ord, text)) >= 128                     # two-byte characters are in play
    lead_bytes = [i for i in range(tok.num_ids)
                  if tok.token_text(i) == '\ufffd']      # one byte of a two-byte character
    assert lead_bytes
    with pytest.raises(FastDecodeError, match='UTF-8'):
        tok.decode(ids[:-1] + [lead_bytes[0]])
    assert np.linalg.norm(tok.decode(ids) - chunk) <= tok.params.max_error_l2


def test_encoding_refuses_what_it_cannot_spell(tokenizer):
    with pytest.raises(ValueError, match=r'expected \(10, 7\)'):
        tokenizer.encode(np.zeros((H + 1, D)))
    far = np.zeros((H, D))
    far[:, 0] = -50.0                       # DC coefficient far below min_token
    with pytest.raises(ValueError, match='cannot be encoded'):
        tokenizer.encode(far)


def test_fit_validates_its_input():
    with pytest.raises(ValueError, match='N, H, D'):
        fit_fast_tokenizer(np.zeros((4, 10)))
    with pytest.raises(ValueError, match='vocab_size: 16 is smaller'):
        fit_fast_tokenizer(synthetic_action_chunks(20, H, D), vocab_size=16, scale=100.0)
    with pytest.raises(ValueError, match='scale'):
        FastParams(0.0, 0, H, D, 512)
    with pytest.raises(ValueError, match='action_dim'):
        FastParams(10.0, 0, H, 0, 512)


def test_the_synthetic_tokenizer_encodes_every_normalised_chunk(tokenizer):
    """min_token covers the largest coefficient a chunk in [-1, 1] can have, sqrt(H) x scale
    (a constant -1): rough chunks are encodable too, within the same bound."""
    assert tokenizer.params.min_token == -round(math.sqrt(H) * 10.0)
    rng = np.random.default_rng(1)
    rough = [rng.uniform(-1, 1, (H, D)), np.full((H, D), -1.0), np.full((H, D), 1.0),
             np.where(np.arange(H)[:, None] % 2 == 0, 1.0, -1.0) * np.ones((1, D))]
    for chunk in rough:
        decoded = tokenizer.decode(tokenizer.encode(chunk))
        assert np.linalg.norm(decoded - chunk) <= tokenizer.params.max_error_l2
