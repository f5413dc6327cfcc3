"""Action tokens, de-tokenisation and un-normalisation (docs/openvla.md, Action tokens).

Pure numpy, no torch. Expected values are computed by hand from the reference's formulas
(``bin_centers[i] = -1 + (2i + 1) / 255``, token = V - digitize(a), ``a = 0.5 (x + 1)(q99 - q01)
+ q01`` where masked), never read back from the code under test.
"""
import math

import numpy as np
import pytest

from vla_spec_ros.actions import ActionStats, UnnormKeyError, resolve_unnorm_key, stats_by_key
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer

OPENVLA_VOCAB, OPENVLA_PAD = 32064, 64     # Llama 32000 + <PAD>, padded to a multiple of 64
HALF_BIN = 1.0 / 255.0                     # bins are 2/255 wide


def centre(i: int) -> float:
    """The reference's bin centre i (0..254), written out by hand."""
    return -1.0 + (2 * i + 1) / 255.0


@pytest.fixture(scope='module')
def openvla():
    return ActionTokenizer(OPENVLA_VOCAB, OPENVLA_PAD)


# ---- known values for the OpenVLA vocabulary -------------------------------------------------

def test_token_31872_decodes_to_zero(openvla):
    decoded = openvla.decode([31872] * 7)
    assert decoded.is_valid and decoded.invalid_reason is None
    np.testing.assert_allclose(decoded.normalized, 0.0, atol=1e-12)


def test_token_31999_decodes_to_minus_0_99608(openvla):
    decoded = openvla.decode([31999])
    assert decoded.is_valid
    assert decoded.normalized[0] == pytest.approx(-0.99608, abs=1e-5)
    assert decoded.normalized[0] == pytest.approx(-254.0 / 255.0, abs=1e-12)


def test_token_31744_bin_255_is_clipped_to_the_last_centre(openvla):
    # idx = 32000 - 31744 - 1 = 255 has no centre (255 centres, 0..254): clipped to 254.
    decoded = openvla.decode([31744])
    assert decoded.is_valid
    assert decoded.normalized[0] == pytest.approx(centre(254), abs=1e-12)
    assert decoded.normalized[0] == pytest.approx(0.99608, abs=1e-5)


def test_action_token_range_and_bins(openvla):
    assert openvla.first_action_id == 31744 and openvla.last_action_id == 31999
    assert openvla.is_action_token(31744) and openvla.is_action_token(31999)
    assert not openvla.is_action_token(31743) and not openvla.is_action_token(32000)
    assert openvla.token_to_bin(31999) == 0 and openvla.token_to_bin(31744) == 255
    assert openvla.token_to_bin(31872) == 127
    with pytest.raises(ValueError, match='not an action token'):
        openvla.token_to_bin(32000)


@pytest.mark.parametrize('token', [31744, 31800, 31871, 31872, 31873, 31950, 31999])
def test_decode_matches_hand_formula(openvla, token):
    idx = min(max(32000 - token - 1, 0), 254)
    assert openvla.decode([token]).normalized[0] == pytest.approx(centre(idx), abs=1e-12)


def test_encode_known_values(openvla):
    # digitize over linspace(-1, 1, 256): 0.0 lies in (bins[127], bins[128]] -> 128 -> 31872.
    tokens = openvla.encode([0.0, -1.0, 1.0, -5.0, 5.0])
    assert tokens.tolist() == [31872, 31999, 31744, 31999, 31744]   # out of range is clipped


def test_encode_decode_round_trip_within_half_a_bin(openvla):
    values = np.random.default_rng(0).uniform(-1.0, 1.0, 2000)
    values = np.concatenate([values, [-1.0, 1.0, 0.0]])
    tokens = openvla.encode(values)
    assert all(openvla.is_action_token(t) for t in tokens)
    decoded = openvla.decode(tokens)
    assert decoded.is_valid
    assert np.max(np.abs(decoded.normalized - values)) <= HALF_BIN + 1e-12


def test_larger_values_get_smaller_ids(openvla):
    tokens = openvla.encode(np.linspace(-1, 1, 50))
    assert np.all(np.diff(tokens) <= 0)


def test_generalised_vocabulary():
    # tiny preset: vocab 1088, pad multiple 64 -> V = 1024, action ids 768..1023.
    tok = ActionTokenizer(1088, 64)
    assert (tok.first_action_id, tok.last_action_id) == (768, 1023)
    assert tok.decode([1024 - 128]).normalized[0] == pytest.approx(0.0, abs=1e-12)
    assert tok.decode([1023]).normalized[0] == pytest.approx(centre(0), abs=1e-12)
    with pytest.raises(ValueError):
        ActionTokenizer(300, 64)          # V = 236 < 256 bins


# ---- non-action tokens are never clamped ---------------------------------------------------

@pytest.mark.parametrize('bad', [0, 1, 29871, 31743, 32000, 32063])
def test_non_action_token_is_invalid_and_nan(openvla, bad):
    tokens = [31872, bad, 31999, 31872, 31872, 31872, 31872]
    decoded = openvla.decode(tokens)
    assert decoded.is_valid is False
    assert str(bad) in decoded.invalid_reason
    assert math.isnan(decoded.normalized[1])       # never clamped to +-0.996
    others = np.delete(decoded.normalized, 1)
    np.testing.assert_allclose(others, [0.0, centre(0), 0.0, 0.0, 0.0, 0.0], atol=1e-12)


# ---- un-normalisation ------------------------------------------------------------------------

def test_unnormalize_hand_computed():
    stats = ActionStats(q01=np.array([-0.5, 0.0, -2.0, 1.0]),
                        q99=np.array([1.5, 0.2, 2.0, 3.0]),
                        mask=np.array([True, True, True, False]))
    x = np.array([0.5, -1.0, 1.0, 0.3])
    # d0: 0.5 * 1.5 * 2.0 - 0.5 = 1.0; d1: x=-1 -> q01 = 0.0; d2: x=1 -> q99 = 2.0;
    # d3 (gripper, mask False): untouched.
    np.testing.assert_allclose(stats.unnormalize(x), [1.0, 0.0, 2.0, 0.3], atol=1e-12)


def test_unnormalize_midpoint_and_masked_gripper():
    q01 = np.array([-0.02, -0.03, -0.01, -0.1, -0.2, -0.3, 0.0])
    q99 = np.array([0.04, 0.01, 0.05, 0.3, 0.2, 0.1, 1.0])
    mask = np.array([True] * 6 + [False])
    stats = ActionStats.from_norm_stats(
        {'action': {'q01': q01.tolist(), 'q99': q99.tolist(), 'mask': mask.tolist()}}, 'x')
    out = stats.unnormalize(np.array([0.0] * 6 + [0.75]))
    np.testing.assert_allclose(out[:6], [0.01, -0.01, 0.02, 0.1, 0.0, -0.1], atol=1e-12)
    assert out[6] == 0.75


def test_unnormalize_without_mask_normalises_every_dimension():
    stats = ActionStats.from_norm_stats({'action': {'q01': [0.0, 10.0], 'q99': [2.0, 20.0]}},
                                        'k')
    np.testing.assert_allclose(stats.unnormalize(np.array([0.0, -0.5])), [1.0, 12.5])


def test_unnormalize_errors():
    stats = ActionStats.from_norm_stats({'action': {'q01': [0.0] * 7, 'q99': [1.0] * 7}}, 'k')
    with pytest.raises(ValueError, match='dims'):
        stats.unnormalize(np.zeros(6))
    with pytest.raises(ValueError, match="'broken'"):
        ActionStats.from_norm_stats({'proprio': {}}, 'broken')
    with pytest.raises(ValueError, match="'uneven'"):
        ActionStats.from_norm_stats({'action': {'q01': [0.0] * 7, 'q99': [1.0] * 6}}, 'uneven')


# ---- unnorm_key rules ------------------------------------------------------------------------

ONE = {'libero_goal': {}}
TWO = {'bridge_orig': {}, 'libero_goal': {}}


def test_unnorm_key_none_with_one_dataset():
    assert resolve_unnorm_key(ONE, None) == 'libero_goal'
    assert resolve_unnorm_key(ONE, 'libero_goal') == 'libero_goal'


def test_unnorm_key_none_with_two_datasets_lists_keys():
    with pytest.raises(UnnormKeyError) as info:
        resolve_unnorm_key(TWO, None)
    assert isinstance(info.value, ValueError)
    assert 'bridge_orig' in str(info.value) and 'libero_goal' in str(info.value)


def test_unknown_unnorm_key_lists_keys():
    with pytest.raises(UnnormKeyError) as info:
        resolve_unnorm_key(TWO, 'libero_10')
    message = str(info.value)
    assert 'libero_10' in message and 'bridge_orig' in message and 'libero_goal' in message
    assert resolve_unnorm_key(TWO, 'bridge_orig') == 'bridge_orig'


# ---- statistics checked when read ------------------------------------------------------------

@pytest.mark.parametrize('action, match', [
    ({'q01': [1.0, 0.0], 'q99': [0.0, 1.0]}, r'action q01 > q99 at dims \[0\]'),
    ({'q01': [0.0, float('nan')], 'q99': [1.0, 1.0]}, r'action q01 is not finite at dims \[1\]'),
    ({'q01': [0.0, 0.0], 'q99': [1.0, float('inf')]}, r'action q99 is not finite'),
    ({'mode': 'MIN_MAX', 'min': [0.0, 2.0], 'max': [1.0, 1.0]}, r'action min > max at dims \[1\]'),
    ({'mode': 'MEAN_STD', 'mean': [0.0, 0.0], 'std': [1.0, -1.0]}, r'action std < 0'),
    ({'q01': [0.0, 0.0], 'q99': [1.0, 1.0], 'mask': ['no', 'yes']}, 'true/false'),
    ({'q01': [0.0, 0.0], 'q99': [1.0, 1.0], 'mask': [1, 0]}, 'true/false'),
    ({'q01': [0.0, 0.0], 'q99': [1.0, 1.0], 'mask': 'no'}, 'true/false'),
    ({'q01': ['a', 'b'], 'q99': [1.0, 1.0]}, 'malformed'),
    ([1, 2], 'malformed'),
])
def test_statistics_that_would_spoil_every_action_are_refused(action, match):
    with pytest.raises(ValueError, match=match) as info:
        ActionStats.from_norm_stats({'action': action}, 'k', source='stats.json')
    assert str(info.value).startswith("stats.json: norm_stats['k']")


def test_statistics_must_have_the_models_action_dims():
    entry = {'action': {'q01': [0.0] * 6, 'q99': [1.0] * 6}}
    assert ActionStats.from_norm_stats(entry, 'k', action_dim=6).q01.shape == (6,)
    with pytest.raises(ValueError, match="of 6 dims; the model's actions have 7"):
        ActionStats.from_norm_stats(entry, 'k', action_dim=7)


def test_equal_ends_and_numpy_masks_are_fine():
    """A dimension that never moves (q01 == q99, std 0) and a numpy bool mask are valid."""
    stats = ActionStats.from_norm_stats(
        {'action': {'q01': [0.0, -1.0], 'q99': [0.0, 1.0], 'mask': np.array([True, False])}},
        'k')
    assert stats.mask.tolist() == [True, False]
    ActionStats.from_norm_stats({'action': {'mode': 'MEAN_STD', 'mean': [0.0], 'std': [0.0]}},
                                'k')


def test_norm_stats_must_be_an_object_of_datasets():
    with pytest.raises(ValueError, match='stats.json: expected an object of datasets'):
        stats_by_key([{'action': {}}], source='stats.json')
    assert set(stats_by_key({'a': {'action': {'q01': [0.0], 'q99': [1.0]}}}, 1)) == {'a'}
