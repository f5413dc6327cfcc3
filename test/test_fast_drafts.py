"""Drafts for a chunk codec's tokens (engine/drafting/shifted_chunk_drafter.py): the shift and
its extrapolations, the drafter's chains on a real FAST codec, the family default read by
draft_choice, and strict (r = 0) tokens equal to AR's in spec and pipeline_spec on the tiny
random pi0-FAST checkpoint in float64, for consecutive frames whose control step advances."""
import numpy as np
import pytest
import torch

from vla_spec_ros.actions import DecodedActions
from vla_spec_ros.codecs.fast import FastActionCodec
from vla_spec_ros.codecs.fast_synthetic import (fit_synthetic_fast_tokenizer,
                                                synthetic_action_chunks)
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.drafting.draft_choice import default_draft_path, load_draft_for
from vla_spec_ros.engine.drafting.drafter import DraftAdvance, DraftBegin
from vla_spec_ros.engine.drafting.merged_chains import MergedChains
from vla_spec_ros.engine.drafting.previous_action_drafter import PreviousActionDrafter
from vla_spec_ros.engine.drafting.shifted_chunk_drafter import ShiftedChunkDrafter, shift_chunk
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models import registry

H, D = 4, 3
STATS = {'synthetic': {'action': {'q01': [-1.0] * D, 'q99': [1.0] * D}}}


def test_shift_holds_or_continues_the_last_step():
    chunk = np.array([[0.0, 1.0], [0.1, 1.0], [0.2, -1.0], [0.3, -1.0]])
    np.testing.assert_array_equal(shift_chunk(chunk, 0), chunk)
    np.testing.assert_allclose(shift_chunk(chunk, 1, 'hold'),
                               [[0.1, 1.0], [0.2, -1.0], [0.3, -1.0], [0.3, -1.0]])
    np.testing.assert_allclose(shift_chunk(chunk, 2, 'linear'),
                               [[0.2, -1.0], [0.3, -1.0], [0.4, -1.0], [0.5, -1.0]])
    # Past the whole plan: every row extrapolated; linear is clipped to [-1, 1].
    np.testing.assert_allclose(shift_chunk(chunk, 9, 'hold'), [[0.3, -1.0]] * 4)
    np.testing.assert_allclose(shift_chunk(chunk, 9, 'linear')[:, 0], [0.9, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match='extrapolation'):
        shift_chunk(chunk, 1, 'cubic')
    with pytest.raises(ValueError, match='num_steps'):
        shift_chunk(chunk, -1)


@pytest.fixture(scope='module')
def codec():
    tokenizer = fit_synthetic_fast_tokenizer(action_horizon=H, action_dim=D, vocab_size=256)
    return FastActionCodec(tokenizer, vocab_size=1024, end_token=1, prefix_tokens=(7, 8),
                           suffix_tokens=(9,), max_tokens=40)


def test_the_chain_is_the_shifted_chunk_re_encoded(codec):
    # The drafter shifts what the tokens decode to (the quantised chunk).
    chunk = codec.decode(codec.encode(synthetic_action_chunks(1, H, D, seed=4)[0])).normalized
    drafter = ShiftedChunkDrafter(codec, codec.max_tokens)
    assert drafter.prefill_draft('cam', 40, step=3) == []           # nothing observed yet
    drafter.observe_action('cam', codec.encode(chunk), request_id=0, step=10)
    drafter.observe_action('cam', (5, 6, 1), request_id=1, step=11)  # refused: not kept
    expected = codec.encode(shift_chunk(chunk, 2))
    assert tuple(drafter.prefill_draft('cam', 40, step=12)) == expected
    assert tuple(drafter.prefill_draft('cam', 3, step=12)) == expected[:3]
    assert tuple(drafter.prefill_draft('cam', 40, step=None)) == codec.encode(chunk)
    linear = ShiftedChunkDrafter(codec, codec.max_tokens, 'linear')
    linear.observe_action('cam', codec.encode(chunk), request_id=0, step=10)
    assert tuple(linear.prefill_draft('cam', 40, step=12)) == \
        codec.encode(shift_chunk(chunk, 2, 'linear'))
    # After the prefill decided 2 tokens and the root, and a round accepted 2 more + bonus.
    drafter.update([DraftBegin(5, None, range(0), expected[2], 'cam', expected[:2], 12)], [],
                   None)
    tree = drafter.propose_batch([5], [40], 8, 50)[0]
    assert tree.tokens == (expected[2],) + expected[3:]
    drafter.update([], [DraftAdvance(5, [expected[2], expected[3], 77], range(0), 77)], None)
    tree = drafter.propose_batch([5], [2], 8, 50)[0]
    assert tree.tokens == (77,) + expected[6:8]
    drafter.release(5)
    drafter.forget_stream('cam')
    assert drafter.prefill_draft('cam', 40, step=12) == []


def _one_token_per_coefficient(codec, frame) -> tuple:
    """``frame`` spelled again with every coefficient a token of its own (the same
    coefficients in other pieces than the BPE's merges)."""
    body = [t for t in frame if codec.is_action_token(t)]
    text = codec.tokenizer.bpe.decode([codec.to_fast_id(t) for t in body])
    return (*codec.prefix_tokens,
            *(codec.to_model_id(i) for c in text for i in codec.tokenizer.bpe.encode(c).ids))


def test_after_tokens_that_split_the_chunk_differently_the_chain_follows_the_coefficients(
        codec):
    """The verifier decided the draft's first coefficients in other pieces: the chain is the
    codec's continuation by coefficient (FAST), where by position it would be off."""
    chunk = codec.decode(codec.encode(synthetic_action_chunks(1, H, D, seed=4)[0])).normalized
    drafter = ShiftedChunkDrafter(codec, codec.max_tokens)
    drafter.observe_action('cam', codec.encode(chunk), request_id=0, step=10)
    expected = codec.encode(shift_chunk(chunk, 1))
    split = _one_token_per_coefficient(codec, expected)
    assert len(split) > len(expected) - 2          # the BPE merged some coefficients
    decided = split[:6]
    drafter.update([DraftBegin(5, None, range(0), decided[-1], 'cam', decided[:-1], 11)], [],
                   None)
    tree = drafter.propose_batch([5], [40], 8, 50)[0]
    continued = codec.continue_draft(decided, expected)
    assert continued != expected[len(decided):]
    assert tree.tokens == (decided[-1], *continued)
    # The previous action's chain follows the same rule once given the codec's.
    previous = PreviousActionDrafter(codec.max_tokens, codec.step_tokens, codec.continue_draft)
    previous.observe_action('cam', expected, request_id=0, step=10)
    previous.update([DraftBegin(6, None, range(0), decided[-1], 'cam', decided[:-1], 11)], [],
                    None)
    assert previous.propose_batch([6], [40], 8, 50)[0].tokens == (decided[-1], *continued)
    assert previous.propose_batch([6], [3], 8, 50)[0].tokens == (decided[-1], *continued[:3])


def test_a_previous_action_continued_by_the_codec_comes_from_a_whole_action(codec):
    """The source is the stream's newest whole action, never the request's own tokens or a
    frame still in flight; a chunk of several control steps has no single source."""
    frame = codec.encode(synthetic_action_chunks(1, H, D, seed=8)[0])
    calls = []

    def continue_draft(decided, draft):
        calls.append((tuple(decided), tuple(draft)))
        return codec.continue_draft(decided, draft)

    drafter = PreviousActionDrafter(codec.max_tokens, None, continue_draft)
    drafter.update([DraftBegin(1, None, range(0), frame[0], 'cam', (), 3)], [], None)
    assert drafter.propose_batch([1], [40], 8, 50)[0].tokens == (frame[0],)   # none yet
    assert calls == []
    drafter.observe_action('cam', frame, request_id=0, step=2)
    drafter.update([DraftBegin(2, None, range(0), frame[0], 'cam', (), 4)], [], None)
    drafter.propose_batch([2], [40], 8, 50)
    assert calls[-1] == ((frame[0],), frame)        # not request 1's tokens in flight
    with pytest.raises(ValueError, match='one unit'):
        PreviousActionDrafter(8, 2, continue_draft)


def test_a_chunk_older_than_the_frame_is_the_source(codec):
    chunks = [codec.decode(codec.encode(c)).normalized
              for c in synthetic_action_chunks(2, H, D, seed=6)]
    drafter = ShiftedChunkDrafter(codec, codec.max_tokens)
    drafter.observe_action('cam', codec.encode(chunks[0]), request_id=0, step=4)
    drafter.observe_action('cam', codec.encode(chunks[1]), request_id=1, step=7)
    # A frame of step 5 (submitted before the step-7 frame finished) shifts the step-4 chunk.
    assert tuple(drafter.prefill_draft('cam', 40, step=5)) == \
        codec.encode(shift_chunk(chunks[0], 1))
    assert tuple(drafter.prefill_draft('cam', 40, step=9)) == \
        codec.encode(shift_chunk(chunks[1], 2))


def test_merged_chains_hold_both_drafts_in_one_tree(codec):
    chunk = codec.decode(codec.encode(synthetic_action_chunks(1, H, D, seed=4)[0])).normalized
    shifted = ShiftedChunkDrafter(codec, codec.max_tokens)
    previous = PreviousActionDrafter(codec.max_tokens)
    merged = MergedChains([shifted, previous])
    tokens = codec.encode(chunk)
    merged.observe_action('cam', tokens, request_id=0, step=10)
    draft = codec.encode(shift_chunk(chunk, 3))
    assert merged.prefill_draft('cam', 40, step=13) == list(draft)     # the first one's
    merged.update([DraftBegin(1, None, range(0), 7, 'cam', (), 13)], [], None)
    tree = merged.propose_batch([1], [40], 8, 60)[0]
    paths = {tuple(tree.tokens[n] for n in _path(tree, leaf))
             for leaf in range(tree.num_nodes) if leaf not in tree.parents}
    assert paths == {(7,) + draft[1:], (7,) + tokens[1:]}
    # The prefix both share ("Action:" ids) is one path; a small budget cuts the second.
    assert tree.num_nodes == 1 + len(draft) - 1 + len(tokens) - 1 - _common(draft, tokens) + 1
    small = merged.propose_batch([1], [40], 8, len(draft) + 1)[0]
    assert small.num_nodes == len(draft) + 1 and small.tokens[:len(draft)] == (7,) + draft[1:]
    with pytest.raises(ValueError, match='two'):
        MergedChains([shifted])


def _path(tree, node):
    out = []
    while node >= 0:
        out.append(node)
        node = tree.parents[node]
    return out[::-1]


def _common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_only_chunk_codecs_are_drafted():
    class StepCodec:
        action_shape = (7,)
    with pytest.raises(ValueError, match='chunk codec'):
        ShiftedChunkDrafter(StepCodec(), 7)


# ---- the engine, tiny random pi0-FAST, float64 ----------------------------------------------

@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    folder = registry.make_checkpoint('pi0fast-tiny', tmp_path_factory.mktemp('fast'), seed=3)
    return registry.load(folder, torch.float64)


def consecutive_frames(num_frames, seed=0, stream='robot', first_step=20):
    """One camera's frames: the image drifts a little, the control step advances by 1 or 2
    (a frame skipped while the previous one was decoded), the last frame repeats its
    predecessor's image at the next step."""
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (28, 28, 3), dtype=np.uint8)
    frames, step = [], first_step
    for i in range(num_frames):
        if i < num_frames - 1:
            image = np.clip(image.astype(int) + rng.integers(-6, 7, image.shape), 0,
                            255).astype(np.uint8)
        frames.append(Frame(image, 'open the drawer', 'synthetic', stream, control_step=step,
                            state=np.zeros(4)))
        step += 1 + i % 2
    return frames


class EchoCodec:
    """The real codec, except that every frame decodes (to a constant chunk naming it) and a
    chunk encodes back to that frame's tokens: the shifted draft is the previous frame's tokens,
    which a repeated frame accepts whole (exercises the accept paths on a random model)."""

    def __init__(self, codec):
        self.codec, self.frames = codec, []
        self.action_shape = codec.action_shape

    def decode(self, tokens):
        self.frames.append(tuple(tokens))
        return DecodedActions(np.full(self.action_shape, len(self.frames) - 1.0), True, None)

    def encode(self, chunk):
        return self.frames[int(round(chunk[0, 0]))]


def run(loaded, frames, mode, drafter=None, draft_path=None):
    config = EngineConfig(dtype='float64', mode=mode, max_inflight=3, draft_path=draft_path)
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    engine = Engine(runner, STATS, config, draft=drafter)
    out = []
    for frame in frames:         # one camera: frames arrive one after another
        request_id = engine.submit(frame)
        results = {f.request_id: f for f in engine.run_until_idle()}
        assert results[request_id].error is None, results[request_id].error
        out.append(results[request_id].result.tokens)
    return out, engine


@pytest.fixture(scope='module')
def expected(loaded):
    config = EngineConfig(dtype='float64', mode='ar')
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    return reference_tokens(runner, consecutive_frames(5), config)


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
@pytest.mark.parametrize('extrapolation', ['hold', 'linear'])
def test_shifted_chunk_drafts_give_ar_tokens(loaded, expected, mode, extrapolation):
    """A real codec: the random model's frames do not decode, so a valid chunk observed before
    the first frame stays the source, shifted further each frame (drafts mostly rejected)."""
    codec = loaded.codec
    drafter = ShiftedChunkDrafter(codec, codec.max_tokens, extrapolation)
    chunk = synthetic_action_chunks(1, *codec.action_shape, seed=2)[0]
    drafter.observe_action('robot', codec.encode(chunk), request_id=-1, step=19)
    assert drafter.prefill_draft('robot', codec.max_tokens, step=20)
    tokens, _ = run(loaded, consecutive_frames(5), mode, drafter)
    assert tokens == expected


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_accepted_shifted_drafts_give_ar_tokens(loaded, expected, mode):
    drafter = ShiftedChunkDrafter(EchoCodec(loaded.codec), loaded.codec.max_tokens)
    tokens, engine = run(loaded, consecutive_frames(5), mode, drafter)
    assert tokens == expected
    assert tokens[-1] == tokens[-2]
    # The repeated frame was drafted whole: fewer verifier forwards than tokens.
    assert engine.num_verifier_forwards < sum(len(t) for t in tokens)


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
@pytest.mark.parametrize('draft_path', ['previous_action', 'shifted_chunk',
                                        'shifted_chunk_linear',
                                        'shifted_chunk+previous_action', None])
def test_every_headless_draft_by_name_gives_ar_tokens(loaded, expected, mode, draft_path):
    tokens, _ = run(loaded, consecutive_frames(5), mode, draft_path=draft_path)
    assert tokens == expected


def test_the_model_config_names_the_default_draft(loaded):
    config = EngineConfig(dtype='float64', mode='spec')
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    assert default_draft_path(runner) == 'previous_action+shifted_chunk'   # the family's
    drafter = load_draft_for(runner, config, None)
    assert isinstance(drafter, MergedChains)
    assert [type(d) for d in drafter.drafters] == [PreviousActionDrafter, ShiftedChunkDrafter]
    assert drafter.drafters[1].extrapolation == 'hold'
    # The engine reads the model's (protocol) default_draft, set from its config.
    family_default = runner.model.default_draft
    runner.model.default_draft = 'shifted_chunk'
    try:
        assert isinstance(load_draft_for(runner, config, None), ShiftedChunkDrafter)
        runner.model.default_draft = 'checkpoint'
        with pytest.raises(ValueError, match='default_draft'):
            load_draft_for(runner, config, None)
    finally:
        runner.model.default_draft = family_default
