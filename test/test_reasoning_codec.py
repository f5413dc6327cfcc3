"""codecs/reasoning.py: reasoning text, a marker, then OpenVLA's 7 bins. Expected values are
written out by hand: a 32064-id vocabulary padded by 64 (action ids 31744..31999), the
marker "ACTION:" as ECoT's tokenizer writes it (319 9838 29901), then "▁" (29871)."""
import numpy as np
import pytest

from vla_spec_ros.codecs.reasoning import ReasoningThenAction
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer

MARKER, SPACE, EOS = (319, 9838, 29901), 29871, 2
ACTION = (31999, 31744, 31871, 31872, 31900, 31800, 31744)   # bins 0, 255, 128, 127, ...
TEXT = (323, 3289, 29968, 29901, 15154, 278, 11203)          # some reasoning words


@pytest.fixture
def codec():
    return ReasoningThenAction(ActionTokenizer(32064, 64), MARKER, separator=(SPACE,),
                               stop_tokens=(EOS,), max_reasoning_tokens=20)


def test_the_frame_is_complete_after_the_seven_tokens_that_follow_the_marker(codec):
    assert codec.max_tokens == 20 + 3 + 1 + 7
    tokens = TEXT + MARKER + (SPACE,) + ACTION
    for n in range(len(tokens)):
        assert not codec.is_complete(tokens[:n]), n
    assert codec.is_complete(tokens)
    # Without the separator too (it is optional).
    assert codec.is_complete(TEXT + MARKER + ACTION)
    assert not codec.is_complete(TEXT + MARKER + ACTION[:6])


def test_cut_keeps_the_tokens_up_to_the_completing_one(codec):
    decided = TEXT + MARKER + (SPACE,) + ACTION[:5]
    assert codec.cut(decided, ACTION[5:] + (EOS, 5, 6)) == ACTION[5:]
    assert codec.cut((), TEXT) == TEXT


def test_decode_reads_the_bins_after_the_marker(codec):
    decoded = codec.decode(TEXT + MARKER + (SPACE,) + ACTION)
    assert decoded.is_valid
    centers = (np.linspace(-1, 1, 256)[:-1] + np.linspace(-1, 1, 256)[1:]) / 2
    # id 31999 -> bin index clip(32000 - 31999 - 1) = 0 -> the lowest center; 31744 -> 254.
    assert decoded.normalized[0] == centers[0] and decoded.normalized[1] == centers[254]
    parts = codec.split(TEXT + MARKER + (SPACE,) + ACTION)
    assert parts.reasoning == TEXT and parts.action == ACTION


def test_no_action_within_the_budget_is_refused_with_the_reason(codec):
    long_text = (15154,) * codec.max_tokens
    assert codec.is_complete(long_text)
    decoded = codec.decode(long_text)
    assert not decoded.is_valid and 'max_reasoning_tokens 20' in decoded.invalid_reason
    assert np.isnan(decoded.normalized).all()


def test_text_that_ends_without_an_action_is_refused(codec):
    assert codec.is_complete(TEXT + (EOS,))
    decoded = codec.decode(TEXT + (EOS,))
    assert not decoded.is_valid and 'without an action' in decoded.invalid_reason
    decoded = codec.decode(TEXT + MARKER + (SPACE, 15154) + ACTION[:6])
    assert not decoded.is_valid


def test_relaxation_and_restriction_follow_the_action_only(codec):
    assert codec.action_marker == MARKER
    assert codec.action_token_range() is None        # the text needs the whole vocabulary
    assert codec.is_action_token(31744) and not codec.is_action_token(SPACE)
    assert codec.token_to_bin(31999) == 0 and codec.token_to_bin(31744) == 255


def test_bad_settings_name_the_field():
    inner = ActionTokenizer(32064, 64)
    with pytest.raises(ValueError, match='marker'):
        ReasoningThenAction(inner, ())
    with pytest.raises(ValueError, match='max_reasoning_tokens'):
        ReasoningThenAction(inner, MARKER, max_reasoning_tokens=0)
    with pytest.raises(ValueError, match='max_draft_chain'):
        ReasoningThenAction(inner, MARKER, max_draft_chain=0)


def test_cut_equals_its_plain_definition_on_random_outputs(codec):
    """The incremental ``cut`` (the marker found once) against ``cut_reference`` (the whole
    output checked after each token), on random outputs rich in marker pieces, separators,
    stop tokens and action ids, cut at random points."""
    rng = np.random.default_rng(0)
    alphabet = list(MARKER) + [SPACE, EOS, 7, 8, 9] + list(ACTION)
    for _ in range(3000):
        length = int(rng.integers(0, codec.max_tokens + 5))
        tokens = [int(t) for t in rng.choice(alphabet, length)]
        if rng.random() < 0.5 and length > 4:     # a real marker somewhere
            at = int(rng.integers(0, length - 3))
            tokens[at:at + len(MARKER)] = MARKER
        split = int(rng.integers(0, length + 1))
        decided, new = tokens[:split], tokens[split:]
        if len(decided) and codec.is_complete(decided):
            continue                       # the engine never cuts a complete frame
        assert codec.cut(decided, new) == codec.cut_reference(decided, new), (decided, new)
