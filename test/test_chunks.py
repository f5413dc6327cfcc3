"""Chunked 256-bin decoding: a frame decodes K control steps of OpenVLA's bins (K * 7 tokens)
in every mode, the previous chunk shifted by the control steps between two frames is the
draft, and at relax_threshold 0 the tokens are the AR reference's (float64)."""
import numpy as np
import pytest

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import serve_streams

CHUNK = 3
MODES = [dict(mode='ar'), dict(mode='pipeline'), dict(mode='spec'),
         dict(mode='pipeline_spec'), dict(mode='pipeline_spec', max_prefills_per_step=2),
         dict(mode='spec', draft_path='random'), dict(mode='spec', speculative_prefill=False)]


@pytest.fixture(scope='module')
def base(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('chunks') / 'tiny', seed=2)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64', mode='ar')


def chunk_codec(cfg) -> ActionTokenizer:
    return ActionTokenizer(cfg.llm.vocab_size, cfg.pad_to_multiple_of, cfg.n_action_bins,
                           cfg.action_dim, chunk=CHUNK)


def chunk_engine(base, **options) -> Engine:
    runner = base.engine.runner
    cfg = EngineConfig(dtype='float64', **options)
    chunked = ModelRunner(runner.model, runner.cfg, runner.tokenizer, cfg,
                          codec=chunk_codec(runner.cfg))
    return Engine(chunked, base.engine.norm_stats, cfg)


def camera(num: int, seed: int):
    """Two cameras: each shows a scene for three control steps (the same image each step, the
    steps 1 apart), then another; a frame carries its control step."""
    frames = []
    for k in range(num):
        stream, index = f'cam{k % 2}', k // 2
        scene = np.random.default_rng(seed * 100 + k % 2 * 10 + index // 3).integers(
            0, 256, (40, 40, 3), dtype=np.uint8)
        frames.append(Frame(scene, 'open the drawer', 'bridge_orig', stream,
                            control_step=100 + index))
    return frames


def run(engine, frames):
    out = serve_streams(engine, frames)
    return sorted(out, key=lambda f: f.request_id)


def test_the_chunk_codec_decodes_steps():
    codec = ActionTokenizer(32064, 64, 256, 7, chunk=4)
    assert (codec.max_tokens, codec.step_tokens, codec.action_shape) == (28, 7, (4, 7))
    tokens = codec.encode(np.linspace(-1, 1, 28))
    decoded = codec.decode(tokens)
    assert decoded.normalized.shape == (4, 7) and decoded.is_valid
    assert np.allclose(decoded.normalized.ravel(), np.linspace(-1, 1, 28), atol=1 / 127)


@pytest.mark.parametrize('options', MODES, ids=lambda o: '-'.join(map(str, o.values())))
def test_chunked_decoding_gives_the_ar_tokens_in_every_mode(base, options):
    frames = camera(12, seed=3)
    engine = chunk_engine(base, **options)
    expected = reference_tokens(engine.runner, frames, engine.config)
    assert all(len(t) == CHUNK * 7 for t in expected)
    out = run(engine, frames)
    assert [f.result.tokens for f in out] == expected
    assert out[0].result.action.shape == (CHUNK, 7)


def test_the_shifted_previous_chunk_is_accepted_fully_partly_or_not(base):
    """spec, the default drafter: a second frame of a camera's newest image at the same
    control step is decided in its prefill (the chunk repeats); one step later the shifted
    chunk is a different draft, accepted as far as the policy agrees; a stream's first frame
    has nothing to draft from."""
    frames = camera(12, seed=3)
    same_step = [Frame(f.image, f.instruction, f.unnorm_key, f.stream_id, None,
                       f.control_step) for f in frames[-2:]]
    engine = chunk_engine(base, mode='spec')
    expected = reference_tokens(engine.runner, frames + same_step, engine.config)
    out = run(engine, frames + same_step)
    assert [f.result.tokens for f in out] == expected
    accepted = [f.result.stats['prefill_accepted'] for f in out]
    assert accepted[-2:] == [CHUNK * 7 - 1] * 2          # the repeat: its prefill decides it
    assert [f.result.stats['forward_passes'] for f in out[-2:]] == [1, 1]
    assert accepted[0] == 0 and min(accepted) == 0


def test_a_chunked_checkpoint_declares_its_chunk_and_the_policy_decodes_it(tmp_path):
    import dataclasses

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.models.registry import preset
    folder = make_checkpoint(dataclasses.replace(preset('tiny'), action_chunk=2),
                             tmp_path / 'chunked', seed=4)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64')
    assert policy.model_config.action_chunk == 2
    assert policy.engine.runner.max_action_tokens == 14
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    result = policy.predict(image, 'open the drawer', 'bridge_orig')
    assert len(result.tokens) == 14 and result.normalized.shape == (2, 7)
    assert result.action.shape == (2, 7)
    with pytest.raises(ValueError, match='action_chunk'):
        dataclasses.replace(preset('tiny'), action_chunk=0)


def test_training_targets_are_the_next_steps_of_the_episode():
    from vla_spec_ros.actions import chunk_actions
    actions = np.arange(10, dtype=np.float32)[:, None] * np.ones((1, 2), np.float32)
    episodes = np.array([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    chunked = chunk_actions(actions, episodes, 3)
    assert chunked.shape == (10, 3, 2)
    assert chunked[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 3], [3, 3, 3],
                                         [4, 5, 6], [5, 6, 6], [6, 6, 6],
                                         [7, 8, 9], [8, 9, 9], [9, 9, 9]]
