"""pi0-FAST against transformers' PaliGemma (S1, S2, S3, S5 for the second family).

A tiny random-weight checkpoint in LeRobot's layout (``make-checkpoint --preset pi0fast-tiny``)
is loaded twice in float64: by this package (models/pi0fast/, through the model and codec
protocols) and into ``transformers.PaliGemmaForConditionalGeneration`` from the same
safetensors. transformers' greedy ``generate`` with ``token_type_ids`` (0 over the images and
the prompt) applies PaliGemma's prefix-LM mask in generation (the first forward attends
bidirectionally within the prefix; generated tokens are type 1, causal). Every mode of the
engine (ar, pipeline, spec, pipeline_spec at r = 0) must give its tokens frame by frame, with
one, two and three images per frame.

Two arithmetic differences of transformers' float64 run are not ours and are kept: its
RMSNorm casts to float32 (``GemmaRMSNorm``: x.float()), and its positions start at 1 (RoPE
reads differences only). Neither changed a token here; the test would say so.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models import registry
from vla_spec_ros.models.pi0fast.checkpoint import LEROBOT_PREFIX, PALIGEMMA_CONFIG_FILE

transformers = pytest.importorskip('transformers')

INSTRUCTIONS = ['Pick up the red cup', 'open the drawer', 'put the block on the plate']
MODES = ['ar', 'pipeline', 'spec', 'pipeline_spec']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return registry.make_checkpoint('pi0fast-tiny', tmp_path_factory.mktemp('pi0fast'), seed=3)


@pytest.fixture(scope='module')
def loaded(checkpoint):
    return registry.load(checkpoint, torch.float64)


@pytest.fixture(scope='module')
def hf_model(checkpoint):
    import json

    from safetensors.torch import load_file
    from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration
    cfg = PaliGemmaConfig(**json.loads((checkpoint / PALIGEMMA_CONFIG_FILE).read_text()))
    model = PaliGemmaForConditionalGeneration(cfg).to(torch.float64).eval()
    state = {k[len(LEROBOT_PREFIX):]: v
             for k, v in load_file(str(checkpoint / 'model.safetensors')).items()}
    if 'model.vision_tower.post_layernorm.weight' in model.state_dict():
        # transformers 5.24 keeps the SigLIP tower without LeRobot's (5.5's) vision_model.
        state = {k.replace('model.vision_tower.vision_model.', 'model.vision_tower.'): v
                 for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {'lm_head.weight'}
    model.tie_weights()
    assert torch.equal(model.lm_head.weight, model.model.language_model.embed_tokens.weight)
    return model


def make_frames(num_frames, num_images, seed=0, size=28, state_dim=4, stream='robot'):
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(num_frames):
        images = tuple(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                       for _ in range(num_images))
        state = rng.uniform(-1, 1, state_dim)
        frames.append(Frame(images if num_images > 1 else images[0],
                            INSTRUCTIONS[i % len(INSTRUCTIONS)], 'synthetic', stream,
                            state=state))
    return frames


@torch.no_grad()
def hf_tokens(hf_model, runner, frame, max_new_tokens, eos):
    ids = runner.frame_prompt_ids(frame)
    pixels = torch.stack([runner.model.preprocess(torch.from_numpy(image))
                          for image in frame.images]).to(torch.float64)
    num_image_rows = runner.prefix_len(ids, len(frame.images)) - len(ids)
    image_id = hf_model.config.image_token_id
    input_ids = torch.tensor([[image_id] * num_image_rows + ids])
    out = hf_model.generate(input_ids=input_ids, pixel_values=pixels,
                            attention_mask=torch.ones_like(input_ids),
                            token_type_ids=torch.zeros_like(input_ids),
                            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                            pad_token_id=0)
    return tuple(out[0, input_ids.shape[1]:].tolist())


def runner_for(loaded, codec=None, **options):
    config = EngineConfig(dtype='float64', **options)
    return ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config,
                       codec=codec or loaded.codec), config


def run_engine(loaded, frames, codec=None, **options):
    runner, config = runner_for(loaded, codec, **options)
    engine = Engine(runner, {'synthetic': {'action': {'q01': [-1.0] * 3, 'q99': [1.0] * 3}}},
                    config)
    ids = [engine.submit(f) for f in frames]
    results = {f.request_id: f for f in engine.run_until_idle()}
    assert all(results[i].error is None for i in ids), [results[i].error for i in ids]
    return [results[i].result.tokens for i in ids]


@pytest.mark.parametrize('num_images', [1, 2, 3])
def test_the_ar_reference_is_transformers_paligemma(loaded, hf_model, num_images):
    runner, config = runner_for(loaded, mode='ar')
    frames = make_frames(3, num_images, seed=num_images)
    ours = reference_tokens(runner, frames, config)
    codec = loaded.codec
    theirs = [hf_tokens(hf_model, runner, f, codec.max_tokens, codec.end_token) for f in frames]
    assert ours == theirs


@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('num_images', [1, 2, 3])
def test_every_mode_gives_transformers_tokens(loaded, hf_model, mode, num_images):
    frames = make_frames(4, num_images, seed=10 + num_images)
    # A stream that repeats its frame: the previous-action draft is right (spec modes accept).
    frames.append(frames[-1])
    runner, _ = runner_for(loaded, mode='ar')
    codec = loaded.codec
    expected = [hf_tokens(hf_model, runner, f, codec.max_tokens, codec.end_token)
                for f in frames]
    assert run_engine(loaded, frames, mode=mode, max_inflight=3) == expected


def test_the_tiny_model_generates_varied_tokens(loaded):
    """Guards the parity tests against a degenerate random model (one repeated id)."""
    runner, config = runner_for(loaded, mode='ar')
    tokens = reference_tokens(runner, make_frames(3, 1, seed=5), config)
    assert len(set().union(*tokens)) >= 8, tokens
    assert len(set(tokens)) == 3


def test_the_prefix_is_read_in_both_directions(loaded):
    """The same weights with a causal prefix decode other tokens: the bidirectional prefix
    (that transformers' tokens confirm above) is in force, not a no-op."""
    frames = make_frames(3, 2, seed=7)
    runner, config = runner_for(loaded, mode='ar')
    bidirectional = reference_tokens(runner, frames, config)
    loaded.model.prefix_attention = 'causal'
    try:
        causal = reference_tokens(runner_for(loaded, mode='ar')[0], frames, config)
    finally:
        loaded.model.prefix_attention = 'bidirectional'
    assert causal != bidirectional


def _codec_ending_at(loaded, token):
    from vla_spec_ros.codecs.fast import FastActionCodec
    c = loaded.codec
    return FastActionCodec(c.tokenizer, vocab_size=c.vocab_size, end_token=token,
                           skip_tokens=c.skip_tokens, prefix_tokens=c.prefix_tokens,
                           suffix_tokens=c.suffix_tokens, max_tokens=c.max_tokens)


@pytest.mark.parametrize('mode', MODES)
def test_variable_length_frames_end_where_transformers_stops(loaded, hf_model, mode):
    """A frame ends at the codec's end marker (kept, the frame shorter than max_tokens), as
    transformers' generate stops at its EOS. The random model never chooses EOS, so the test
    names as end marker a text token the reference emits early in one frame."""
    frames = make_frames(4, 2, seed=21)
    frames.append(frames[-1])
    runner, config = runner_for(loaded, mode='ar')
    first = reference_tokens(runner, frames[:1], config)[0]
    codec = loaded.codec
    end = next(t for t in first[2:] if not codec.is_action_token(t)
               and t not in codec.prefix_tokens + codec.suffix_tokens)
    codec = _codec_ending_at(loaded, end)
    expected = [hf_tokens(hf_model, runner, f, codec.max_tokens, end) for f in frames]
    assert any(len(t) < codec.max_tokens and t[-1] == end for t in expected)
    assert run_engine(loaded, frames, codec=codec, mode=mode, max_inflight=3) == expected


@pytest.mark.parametrize('mode', ['pipeline', 'pipeline_spec'])
def test_graph_bucket_padding_gives_the_same_tokens(loaded, mode):
    """The step shapes CUDA graphs replay (prompt blocks padded to 64 rows, every block with
    room for the longest drafted chain, segments and rows to powers of two), run eagerly on
    the CPU: a bidirectional prefix must not read its block's padding rows."""
    frames = make_frames(4, 3, seed=31)
    frames.append(frames[-1])
    runner, config = runner_for(loaded, mode='ar')
    expected = reference_tokens(runner, frames, config)
    config = EngineConfig(dtype='float64', mode=mode, max_inflight=3)
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    engine = Engine(runner, {'synthetic': {'action': {'q01': [-1.0] * 3, 'q99': [1.0] * 3}}},
                    config)
    strategy = engine.strategy
    strategy._padded_sizes = lambda prefills, segments, num_moves: strategy._graph_sizes(
        [p.prompt_len for p in prefills], len(segments),
        max((s.num_rows for s in segments), default=1),
        max((s.num_cols for s in segments), default=1), num_moves)
    ids = [engine.submit(f) for f in frames]
    results = {f.request_id: f for f in engine.run_until_idle()}
    assert [results[i].result.tokens for i in ids] == expected


@pytest.mark.parametrize('options', [dict(mode='spec', draft_path='random'),
                                     dict(mode='pipeline_spec', draft_path='random',
                                          draft_previous_action=True)])
def test_an_eagle_draft_head_gives_the_reference_tokens(loaded, options):
    """An EAGLE head (random, seeded) over the Gemma verifier, embedding through its scaled
    ``token_embeddings``: at r = 0 any draft gives the AR tokens (S3)."""
    frames = make_frames(4, 2, seed=41)
    runner, config = runner_for(loaded, mode='ar')
    assert run_engine(loaded, frames, max_inflight=3, **options) == \
        reference_tokens(runner, frames, config)


@pytest.mark.parametrize('variant', ['eager', 'compiled'])
def test_the_baseline_stops_where_the_model_stops(loaded, hf_model, variant):
    """The package's transformers baseline (models/pi0fast/baseline.py) decodes what
    transformers' own PaliGemma decodes, ends each frame at the codec's end marker as the engine
    does, and its compiled variant (one StaticCache reset per frame, generate's compiled
    decode; torch.compile's "eager" backend here, so it runs on a CPU) gives the same tokens,
    frame after frame."""
    from vla_spec_ros.models.pi0fast.baseline import PaliGemmaBaseline

    frames = make_frames(4, 1, seed=21)
    runner, config = runner_for(loaded, mode='ar')
    first = reference_tokens(runner, frames[:1], config)[0]
    codec = loaded.codec
    end = next(t for t in first[2:] if not codec.is_action_token(t)
               and t not in codec.prefix_tokens + codec.suffix_tokens)
    runner, config = runner_for(loaded, _codec_ending_at(loaded, end), mode='ar')
    baseline = PaliGemmaBaseline(runner, config, variant=variant, compile_backend='eager')
    assert baseline.label == ('hf' if variant == 'eager' else 'hf_compiled')
    got = [tuple(baseline.generate_frame(f)) for f in frames]
    expected = [hf_tokens(hf_model, runner, f, runner.codec.max_tokens, end) for f in frames]
    assert got == expected
    assert any(len(t) < runner.codec.max_tokens and t[-1] == end for t in got)
    assert got == [tuple(t) for t in run_engine(loaded, frames, codec=runner.codec, mode='ar')]


def test_the_baseline_variant_is_checked(loaded):
    from vla_spec_ros.models.pi0fast.baseline import PaliGemmaBaseline

    runner, config = runner_for(loaded, mode='ar')
    with pytest.raises(ValueError, match='variant'):
        PaliGemmaBaseline(runner, config, variant='fast')
