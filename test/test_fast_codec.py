"""The FAST codec (codecs/fast.py) through the codec protocol, configured as pi0-FAST: the
vocabulary-id mapping 257023 - t, a frame's layout ("Action: " ids, FAST ids, "|", EOS),
refused frames, the end marker in ``cut`` / ``is_complete``, and what relaxed acceptance
means for BPE tokens (one DCT coefficient's quantisation steps), checked with the engine's
own acceptance rule."""
import math

import numpy as np
import pytest

from vla_spec_ros.action_codec import ActionCodec
from vla_spec_ros.actions import ActionStats
from vla_spec_ros.codecs import FastActionCodec
from vla_spec_ros.codecs.fast import ISOLATED_BIN_BASE, ISOLATED_BIN_STRIDE
from vla_spec_ros.codecs.fast_synthetic import (fit_synthetic_fast_tokenizer,
                                                synthetic_action_chunks)
from vla_spec_ros.engine.drafting.acceptance import accept
from vla_spec_ros.engine.drafting.draft_tree import chain_tree
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer

H, D = 10, 7
PALIGEMMA_VOCAB = 257152
EOS, BAR = 1, 235371                # stand-ins for PaliGemma's EOS and "|" ids
ACTION_PREFIX = (4022, 235292, 235248)  # stand-ins for the ids of "Action: "


@pytest.fixture(scope='module')
def tokenizer():
    return fit_synthetic_fast_tokenizer(action_horizon=H, action_dim=D)


def openpi_codec(tokenizer, **kwargs):
    """openpi's layout: the frame ends at EOS, after "|"."""
    return FastActionCodec(tokenizer, vocab_size=PALIGEMMA_VOCAB, end_token=EOS,
                           prefix_tokens=ACTION_PREFIX, suffix_tokens=(BAR,), **kwargs)


@pytest.fixture(scope='module')
def codec(tokenizer):
    return openpi_codec(tokenizer)


@pytest.fixture(scope='module')
def chunk():
    return synthetic_action_chunks(1, H, D, seed=21)[0]


def test_fast_id_t_is_vocabulary_id_257023_minus_t(codec, tokenizer):
    n = tokenizer.num_ids
    for t in (0, 1, 17, n - 1):
        assert codec.to_model_id(t) == 257023 - t
        assert codec.to_fast_id(257023 - t) == t
    assert codec.action_token_range() == (257023 - (n - 1), 257023)
    assert codec.is_action_token(257023) and codec.is_action_token(257023 - (n - 1))
    assert not codec.is_action_token(257024)            # the 128 skipped ids
    assert not codec.is_action_token(PALIGEMMA_VOCAB - 1)
    assert not codec.is_action_token(257023 - n)
    with pytest.raises(ValueError, match='not a FAST token'):
        codec.to_fast_id(257024)
    with pytest.raises(ValueError, match='outside'):
        codec.to_model_id(n)


def test_a_frame_round_trips_within_one_quantisation_step(codec, tokenizer, chunk):
    frame = codec.encode(chunk)
    fast_ids = tokenizer.encode(chunk)
    assert frame == (*ACTION_PREFIX, *(257023 - t for t in fast_ids), BAR, EOS)
    decoded = codec.decode(frame)
    assert decoded.is_valid and decoded.invalid_reason is None
    assert decoded.normalized.shape == codec.action_shape == (H, D)
    assert np.linalg.norm(decoded.normalized - chunk) <= 0.5 * math.sqrt(H * D) / 10.0
    # The engine un-normalises the chunk with the dataset's quantiles, per dimension.
    stats = ActionStats(np.full(D, -2.0), np.full(D, 2.0), np.ones(D, dtype=bool))
    np.testing.assert_allclose(stats.unnormalize(decoded.normalized), 2.0 * decoded.normalized)
    # FAST ids as LeRobot reads them (vocab - 1 - 128 - id), decoded by the tokenizer alone.
    lerobot_ids = [PALIGEMMA_VOCAB - 1 - 128 - t for t in frame[len(ACTION_PREFIX):-2]]
    assert np.array_equal(decoded.normalized, tokenizer.decode(lerobot_ids))


def test_malformed_frames_are_refused_never_padded(codec, chunk):
    frame = codec.encode(chunk)
    body = list(frame[3:-2])
    p, end = list(ACTION_PREFIX), [BAR, EOS]
    cases = {
        'no tokens': [],
        'no end marker': frame[:-1],                            # cut at max_tokens
        'expected the prefix': [4022, 9, 235248] + body + end,
        'expected': p + body + [EOS],                           # "|" missing
        'non-action token': p + body[:2] + [235248] + body[2:] + end,
        'decode to': p + body[:-1] + end,                       # one token short
        'no FAST tokens': p + end,
    }
    for reason, tokens in cases.items():
        decoded = codec.decode(tokens)
        assert not decoded.is_valid, reason
        assert reason in decoded.invalid_reason
        assert decoded.normalized.shape == (H, D) and np.isnan(decoded.normalized).all()
    one_more = codec.decode(p + body + body[-1:] + end)             # one token too many
    assert not one_more.is_valid and 'decode to' in one_more.invalid_reason


def test_the_end_marker_cuts_and_completes(tokenizer, chunk):
    openpi = openpi_codec(tokenizer, max_tokens=40)
    frame = openpi.encode(chunk)
    assert openpi.end_token == EOS and openpi.max_tokens == 40
    # "|" does not end an openpi frame; EOS does, and is kept.
    assert not openpi.is_complete(frame[:-1]) and openpi.is_complete(frame)
    assert openpi.cut(frame[:5], frame[5:] + (77, 78)) == frame[5:]
    assert openpi.cut((), (257000,) * 50) == (257000,) * 40             # max_tokens
    assert openpi.is_complete((257000,) * 40)
    lerobot = FastActionCodec(tokenizer, vocab_size=PALIGEMMA_VOCAB, end_token=BAR,
                              prefix_tokens=ACTION_PREFIX)
    lerobot_frame = lerobot.encode(chunk)
    assert lerobot_frame == frame[:-1]                  # ends at "|"
    assert lerobot.cut(lerobot_frame[:4], lerobot_frame[4:] + (EOS,)) == lerobot_frame[4:]
    assert lerobot.is_complete(lerobot_frame)
    np.testing.assert_array_equal(lerobot.decode(lerobot_frame).normalized,
                                  openpi.decode(frame).normalized)
    assert lerobot.text_tokens == (*ACTION_PREFIX, BAR)
    assert openpi.text_tokens == (*ACTION_PREFIX, BAR, EOS)


def test_the_constructor_refuses_inconsistent_family_facts(tokenizer):
    def make(**kwargs):
        args = dict(vocab_size=PALIGEMMA_VOCAB, end_token=EOS, prefix_tokens=ACTION_PREFIX,
                    suffix_tokens=(BAR,))
        args.update(kwargs)
        return FastActionCodec(tokenizer, **args)
    with pytest.raises(ValueError, match='end_token'):
        make(end_token=257000)                          # inside the FAST range
    with pytest.raises(ValueError, match='prefix_tokens'):
        make(prefix_tokens=(257020,))
    with pytest.raises(ValueError, match='end_token'):
        make(end_token=BAR)                             # the frame would end at "|"
    with pytest.raises(ValueError, match='max_tokens'):
        make(max_tokens=5)                              # 3 + 1 + 1 leave no FAST token
    with pytest.raises(ValueError, match='vocab_size'):
        make(vocab_size=300, end_token=1, prefix_tokens=(), suffix_tokens=())
    with pytest.raises(ValueError, match='end_token'):
        make(end_token=PALIGEMMA_VOCAB)
    with pytest.raises(ValueError, match='skip_tokens'):
        make(skip_tokens=-1)


def test_encoding_a_chunk_longer_than_max_tokens_is_refused(tokenizer, chunk):
    short = openpi_codec(tokenizer, max_tokens=8)
    with pytest.raises(ValueError, match='max_tokens'):
        short.encode(chunk)


def test_from_folder_reads_a_saved_tokenizer(tokenizer, tmp_path, chunk):
    tokenizer.save(tmp_path)
    loaded = FastActionCodec.from_folder(tmp_path, vocab_size=PALIGEMMA_VOCAB, end_token=EOS,
                                         prefix_tokens=ACTION_PREFIX, suffix_tokens=(BAR,))
    codec = openpi_codec(tokenizer)
    assert loaded.encode(chunk) == codec.encode(chunk)
    assert loaded.action_token_range() == codec.action_token_range()
    assert loaded.action_shape == (H, D) and loaded.max_tokens == 256


def single_coefficient_ids(tokenizer):
    """q -> the FAST id of the token spelling coefficient q alone, looked up in the vocabulary
    by its byte-level characters (tokenizers' own byte mapping)."""
    from tokenizers import pre_tokenizers
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    vocab = tokenizer.bpe.get_vocab()
    ids = {}
    for q in range(tokenizer.params.min_token, -tokenizer.params.min_token + 1):
        (piece, _), = byte_level.pre_tokenize_str(chr(q - tokenizer.params.min_token))
        ids[q] = vocab[piece]
    return ids


def test_a_single_coefficient_tokens_bin_is_its_coefficient(codec, tokenizer):
    ids = single_coefficient_ids(tokenizer)
    for q, fast_id in ids.items():
        assert codec.token_to_bin(codec.to_model_id(fast_id)) == q
    zero = ids[0]
    bins = [codec.token_to_bin(codec.to_model_id(i)) for i in range(tokenizer.num_ids)]
    coefficient_bins = [(i, b) for i, b in enumerate(bins) if b < ISOLATED_BIN_BASE]
    # Every id with a coefficient bin q spells q alone, read in a whole sequence (padded with
    # zeros to H x D). Two ids may share a bin: the published alphabet's raw characters
    # below 33 are vocabulary entries beside their byte-level spellings, and decode alike.
    for i, q in coefficient_bins:
        assert tokenizer.decode_coefficients([i] + [zero] * (H * D - 1))[0] == q
    assert len(coefficient_bins) > len(ids)
    # Every other token is farther than any relax_threshold from every token but itself.
    isolated = [(i, b) for i, b in enumerate(bins) if b >= ISOLATED_BIN_BASE]
    assert isolated
    for i, b in isolated:
        text = tokenizer.token_text(i)                          # not one whole coefficient
        assert len(text) != 1 or text == '\ufffd'
        nearest = min(abs(b - other) for j, other in enumerate(bins) if j != i)
        assert nearest >= ISOLATED_BIN_STRIDE > 255


def test_relaxing_one_coefficient_moves_one_dimension_by_r_over_scale(codec, tokenizer, chunk):
    """Swap a single-coefficient token for its neighbour q + 1: the engine's relaxed rule
    accepts it at r = 1 (not at r = 0), and the decoded chunk moves in one dimension only, by
    exactly 1 / scale in L2 norm."""
    ids = single_coefficient_ids(tokenizer)
    coefficient_of = {fast_id: q for q, fast_id in ids.items()}
    frame = list(codec.encode(chunk))
    # The first FAST token that spells one coefficient q with q + 1 in the vocabulary.
    position, q = next((i, coefficient_of[codec.to_fast_id(t)]) for i, t in enumerate(frame)
                       if codec.is_action_token(t) and codec.to_fast_id(t) in coefficient_of
                       and coefficient_of[codec.to_fast_id(t)] + 1 in ids)
    swapped = frame.copy()
    swapped[position] = codec.to_model_id(ids[q + 1])
    a, b = codec.decode(frame), codec.decode(swapped)
    assert a.is_valid and b.is_valid
    moved = np.linalg.norm(b.normalized - a.normalized, axis=0)        # per dimension
    assert np.count_nonzero(moved > 1e-12) == 1
    assert moved.max() == pytest.approx(1.0 / tokenizer.params.scale)
    tree = chain_tree(frame[position - 1], [swapped[position]])
    verifier = [frame[position], frame[position + 1]]
    rule = dict(is_action_token=codec.is_action_token, token_to_bin=codec.token_to_bin)
    assert accept(tree, verifier, relax_threshold=1, **rule).num_accepted == 1
    assert accept(tree, verifier, relax_threshold=0, **rule).num_accepted == 0


def test_a_merged_token_is_accepted_only_exactly(codec, tokenizer):
    merged = [i for i in range(tokenizer.num_ids) if len(tokenizer.token_text(i)) >= 2][:2]
    draft, verifier = (codec.to_model_id(i) for i in merged)
    rule = dict(is_action_token=codec.is_action_token, token_to_bin=codec.token_to_bin)
    tree = chain_tree(ACTION_PREFIX[-1], [draft])
    assert accept(tree, [verifier, EOS], relax_threshold=255, **rule).num_accepted == 0
    assert accept(tree, [draft, EOS], relax_threshold=0, **rule).num_accepted == 1


def test_relaxed_acceptance_can_be_refused(tokenizer):
    strict = openpi_codec(tokenizer, relaxed_acceptance=False)
    assert not strict.supports_relaxed_acceptance
    with pytest.raises(ValueError, match='relax_threshold 0'):
        strict.token_to_bin(257023)
    assert openpi_codec(tokenizer).supports_relaxed_acceptance
    # The protocol's default, which OpenVLA's bins keep.
    assert ActionCodec.supports_relaxed_acceptance
    assert ActionTokenizer(32064, 64).supports_relaxed_acceptance


def test_one_frame_is_one_unit_for_temporal_drafting(codec):
    assert codec.step_tokens == codec.max_tokens


# ---- continue_draft: a draft continued by coefficient, not by token position ----------------

def _text(codec, frame) -> str:
    """The coefficient characters a frame's FAST ids spell."""
    body = [t for t in frame if codec.is_action_token(t)]
    return codec.tokenizer.bpe.decode([codec.to_fast_id(t) for t in body])


def _spelled(codec, text) -> tuple:
    """``text`` spelled on its own by the BPE, as model ids."""
    return tuple(codec.to_model_id(i) for i in codec.tokenizer.bpe.encode(text).ids)


def test_a_draft_continues_after_the_coefficients_the_decided_tokens_spell(codec):
    """Decided tokens that spell the draft's first m coefficients in other pieces (each
    coefficient a token of its own) are continued by the draft's coefficients from m on, then
    "|" and EOS; by position the draft would repeat or skip coefficients."""
    tail = (*codec.suffix_tokens, codec.end_token)
    checked = differs = 0
    for seed in range(6):
        draft = codec.encode(synthetic_action_chunks(1, H, D, seed=40 + seed)[0])
        text = _text(codec, draft)
        for m in range(0, len(text) + 1, 7):
            decided = ACTION_PREFIX + tuple(t for c in text[:m] for t in _spelled(codec, c))
            continued = codec.continue_draft(decided, draft)
            assert continued[-len(tail):] == tail
            assert _text(codec, continued) == text[m:]
            # The decided tokens and their continuation decode to the draft's chunk.
            assert np.array_equal(codec.decode((*decided, *continued)).normalized,
                                  codec.decode(draft).normalized)
            differs += continued != draft[len(decided):]
            checked += 1
    assert checked > 20 and differs > checked // 2


def test_a_decided_coefficient_that_differs_keeps_the_drafts_later_ones(codec):
    """The verifier decided another value for one coefficient: the continuation is the draft's
    coefficients after it, whatever length the decided token had."""
    draft = codec.encode(synthetic_action_chunks(1, H, D, seed=3)[0])
    text = _text(codec, draft)
    for m in (1, 5, 20):
        changed = text[:m - 1] + chr(ord(text[m - 1]) + 1)
        decided = ACTION_PREFIX + _spelled(codec, changed)
        assert _text(codec, codec.continue_draft(decided, draft)) == text[m:]


def test_where_coefficients_mean_nothing_the_draft_continues_by_position(codec, tokenizer):
    draft = codec.encode(synthetic_action_chunks(1, H, D, seed=4)[0])
    # Still in the "Action: " prefix, or already past the FAST ids ("|" decided).
    for decided in (ACTION_PREFIX[:1], ACTION_PREFIX,
                    draft[:len(ACTION_PREFIX) + 2] + (BAR,)):
        assert codec.continue_draft(decided, draft) == draft[len(decided):]
    # A draft in another layout (no prefix) is continued by position too.
    decided = draft[:len(ACTION_PREFIX) + 2]
    assert codec.continue_draft(decided, draft[3:]) == draft[3 + len(decided):]


def test_decided_tokens_ending_inside_a_character_continue_by_position():
    """At scale 100 the coefficients reach code points past 127, two UTF-8 bytes each, and the
    byte-level alphabet holds ids of one byte: decided tokens may end halfway through a
    coefficient, where no coefficient index is known."""
    wide = openpi_codec(fit_synthetic_fast_tokenizer(action_horizon=H, action_dim=D,
                                                     scale=100.0, vocab_size=1024))
    draft = wide.encode(synthetic_action_chunks(1, H, D, seed=5)[0])
    partial = [i for i in range(wide.tokenizer.num_ids)
               if wide.tokenizer.token_text(i) == '\ufffd']
    assert partial, 'the scale-100 tokenizer has no id of part of a character'
    decided = ACTION_PREFIX + (wide.to_model_id(partial[0]),)
    assert wide.continue_draft(decided, draft) == draft[len(decided):]


def test_the_protocol_continues_a_draft_by_position():
    bins = ActionTokenizer(32000, 64)
    assert bins.positional_drafts
    assert bins.continue_draft([31800, 31801], [1, 2, 3, 4, 5]) == (3, 4, 5)
    assert bins.continue_draft([1, 2, 3, 4, 5, 6], [1, 2, 3]) == ()
