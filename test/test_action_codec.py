"""The action-codec protocol (action_codec.py): the engine decodes what its codec asks for.

Two test-only codecs, defined here and handed to the model runner, run through every decoding
mode in float64 and give the plain AR reference's tokens (cut by the same codec): one whose
frames decode four tokens (not OpenVLA's seven), one whose frames end at a marker token. No
engine file knows either of them.
"""
import collections

import numpy as np
import pytest

from vla_spec_ros.action_codec import ActionCodec
from vla_spec_ros.actions import DecodedActions
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import serve_streams

MODES = [dict(mode='ar'), dict(mode='pipeline'), dict(mode='spec'),
         dict(mode='pipeline_spec'), dict(mode='spec', draft_path='random'),
         dict(mode='pipeline_spec', max_prefills_per_step=2)]


class EveryTokenCodec(ActionCodec):
    """A toy: ``num_tokens`` tokens per frame, every token id an action, its value id mod 255
    spread over [-1, 1]; a chunk of ``num_tokens`` one-dimensional steps."""

    def __init__(self, num_tokens: int, end_token: int | None = None):
        self.max_tokens = num_tokens
        self.end_token = end_token
        self.action_shape = (num_tokens, 1)

    def is_action_token(self, token):
        return True

    def token_to_bin(self, token):
        return int(token) % 255

    def decode(self, tokens):
        values = np.full(self.action_shape, 0.0)
        for i, token in enumerate(tokens):
            values[i, 0] = self.token_to_bin(token) / 127.0 - 1.0
        return DecodedActions(values, True, None)


def test_the_bins_codec_is_openvlas_fixed_length():
    codec = ActionTokenizer(32064, 64, 256, 7)
    assert (codec.max_tokens, codec.end_token, codec.action_shape) == (7, None, (7,))
    assert codec.action_token_range() == (31744, 31999)
    assert not codec.is_complete([1] * 6) and codec.is_complete([1] * 7)
    assert codec.cut([1] * 5, [7, 8, 9]) == (7, 8)


def test_a_marker_ends_a_frame_and_is_kept():
    codec = EveryTokenCodec(7, end_token=5)
    assert codec.cut([], [3, 5, 9]) == (3, 5)
    assert codec.cut([1, 2], [3, 4]) == (3, 4)
    assert codec.is_complete([3, 5]) and not codec.is_complete([3, 4])
    assert codec.cut([1] * 6, [2, 3]) == (2,)


@pytest.fixture(scope='module')
def model(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('codec') / 'tiny', seed=7)
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64', mode='ar')
    return policy.engine.runner


@pytest.fixture(scope='module')
def frames():
    rng = np.random.default_rng(5)
    return [Frame(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8),
                  ('open the drawer', 'pick up the cup')[i % 2], 'toy', f'cam{i % 2}')
            for i in range(12)]


def engine_with(base: ModelRunner, codec: ActionCodec, **options) -> Engine:
    cfg = EngineConfig(dtype='float64', **options)
    runner = ModelRunner(base.model, base.cfg, base.tokenizer, cfg, codec=codec)
    dims = int(np.prod(codec.action_shape[1:])) if len(codec.action_shape) > 1 else \
        codec.action_shape[0]
    norm_stats = {'toy': {'action': {'q01': [-1.0] * dims, 'q99': [1.0] * dims}}}
    draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
    return Engine(runner, norm_stats, cfg, draft=draft)


def run(engine, frames):
    out = serve_streams(engine, frames)
    return sorted(out, key=lambda f: f.request_id)


@pytest.mark.parametrize('options', MODES, ids=lambda o: '-'.join(map(str, o.values())))
def test_four_tokens_per_frame_in_every_mode(model, frames, options):
    codec = EveryTokenCodec(4)
    engine = engine_with(model, codec, **options)
    expected = reference_tokens(engine.runner, frames, engine.config)
    assert all(len(t) == 4 for t in expected)
    out = run(engine, frames + frames[:2])      # repeats: the previous action drafts
    assert [f.result.tokens for f in out] == expected + expected[:2]
    assert out[0].result.action.shape == (4, 1)


def marker_for(model, frames) -> int:
    """A token the seven-token reference emits in the middle of some frames' actions but not
    of all, so a marker codec ends some frames early and lets others run to the end."""
    tokens = reference_tokens(model, frames, EngineConfig(dtype='float64', mode='ar'))
    counts = collections.Counter(t for action in tokens for t in set(action[1:5]))
    for token, count in counts.most_common():
        if count < len(frames):
            return token
    raise AssertionError('no token to end frames with')


@pytest.mark.parametrize('options', MODES, ids=lambda o: '-'.join(map(str, o.values())))
def test_frames_ending_at_a_marker_in_every_mode(model, frames, options):
    codec = EveryTokenCodec(7, end_token=marker_for(model, frames))
    engine = engine_with(model, codec, **options)
    expected = reference_tokens(engine.runner, frames, engine.config)
    lengths = [len(t) for t in expected]
    assert min(lengths) < max(lengths) == 7         # some end early, some run to the end
    assert all(t[-1] == codec.end_token for t in expected if len(t) < 7)
    out = run(engine, frames + frames[:2])
    assert [f.result.tokens for f in out] == expected + expected[:2]
