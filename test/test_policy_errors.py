"""Bad input through the public API (``VLAPolicy.predict``, ``Engine.submit``,
``EngineConfig``): each raises a ``ValueError`` with a clear message and queues nothing (README
"Python API", S1). Also: ``restrict_to_action_tokens`` yields valid actions, and an unrestricted
non-action token is flagged, never executed.
"""
import ast
from pathlib import Path

import numpy as np
import pytest

from vla_spec_ros import assets
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import causal_batch
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.models.weights import CheckpointError
from vla_spec_ros.policy import VLAPolicy, resolve_checkpoint

GOOD_IMAGE = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
INSTRUCTION = 'pick up the red cup'


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('policy') / 'tiny', seed=1)


@pytest.fixture(scope='module')
def policy(folder):
    return VLAPolicy.from_pretrained(str(folder))


@pytest.fixture(scope='module')
def pipeline_engine(policy):
    return Engine(policy.engine.runner, policy.engine.norm_stats,
                  EngineConfig(mode='pipeline'))


def _engines(policy, pipeline_engine):
    return [policy.engine, pipeline_engine]


BAD_INPUTS = [
    (GOOD_IMAGE.astype(np.float32) / 255.0, INSTRUCTION, 'bridge_orig', 'uint8'),
    (GOOD_IMAGE.astype(np.uint16), INSTRUCTION, 'bridge_orig', 'uint8'),
    (GOOD_IMAGE[:, :, 0], INSTRUCTION, 'bridge_orig', 'shape'),
    (np.zeros((48, 64, 4), dtype=np.uint8), INSTRUCTION, 'bridge_orig', 'shape'),
    (GOOD_IMAGE.transpose(2, 0, 1).copy(), INSTRUCTION, 'bridge_orig', 'shape'),
    (GOOD_IMAGE, '', 'bridge_orig', 'empty'),
    (GOOD_IMAGE, '   ', 'bridge_orig', 'empty'),
    (GOOD_IMAGE, INSTRUCTION, 'libero_10', 'libero_10'),
    (GOOD_IMAGE, INSTRUCTION, None, 'unnorm_key'),
]


@pytest.mark.parametrize('image, instruction, key, match', BAD_INPUTS)
def test_predict_rejects_bad_input(policy, image, instruction, key, match):
    with pytest.raises(ValueError, match=match):
        policy.predict(image, instruction, key)
    assert not policy.engine.has_work()


@pytest.mark.parametrize('image, instruction, key, match', BAD_INPUTS)
def test_submit_rejects_bad_input_and_queues_nothing(policy, pipeline_engine, image,
                                                     instruction, key, match):
    for engine in _engines(policy, pipeline_engine):
        with pytest.raises(ValueError, match=match):
            engine.submit(Frame(image, instruction, key))
        assert not engine.has_work() and not engine.has_waiting()
        assert engine.step() == []


@pytest.mark.parametrize('stream_id', ['', None, 3])
def test_submit_rejects_a_frame_without_a_stream(policy, pipeline_engine, stream_id):
    for engine in _engines(policy, pipeline_engine):
        with pytest.raises(ValueError, match='stream_id: a non-empty string'):
            engine.submit(Frame(GOOD_IMAGE, INSTRUCTION, 'bridge_orig', stream_id))
        assert not engine.has_work() and not engine.has_waiting()


def test_unnorm_key_errors_list_the_available_keys(policy):
    for key in ('libero_10', None):
        with pytest.raises(ValueError) as info:
            policy.predict(GOOD_IMAGE, INSTRUCTION, key)
        assert 'bridge_orig' in str(info.value) and 'libero_goal' in str(info.value)


def test_good_input_after_bad_input_still_works(policy):
    with pytest.raises(ValueError):
        policy.predict(GOOD_IMAGE, '', 'bridge_orig')
    result = policy.predict(GOOD_IMAGE, INSTRUCTION, 'bridge_orig')
    # The public result: tokens (tuple of ints), float64 normalized/action, stats.
    assert isinstance(result.tokens, tuple) and len(result.tokens) == 7
    assert all(type(t) is int for t in result.tokens)
    assert result.normalized.dtype == result.action.dtype == np.float64
    assert result.normalized.shape == result.action.shape == (7,)
    assert result.stats['unnorm_key'] == 'bridge_orig'
    assert result.stats['forward_passes'] == 7
    assert result.stats['accepted_lengths'] == [1] * 7
    assert result.stats['latency_s'] > 0


def test_predict_refuses_a_busy_engine(policy):
    request_id = policy.engine.submit(Frame(GOOD_IMAGE, INSTRUCTION, 'bridge_orig'))
    try:
        with pytest.raises(RuntimeError, match='idle'):
            policy.predict(GOOD_IMAGE, INSTRUCTION, 'bridge_orig')
    finally:
        assert policy.engine.reset() == [request_id]
    assert not policy.engine.has_work()


# ---- EngineConfig validation -----------------------------------------------------------------

@pytest.mark.parametrize('options, field', [
    ({'modee': 'ar'}, 'modee'),
    ({'relax_threshold': -1}, 'relax_threshold'),
    ({'relax_threshold': 256}, 'relax_threshold'),
    ({'relax_threshold': 1.5}, 'relax_threshold'),
    ({'mode': 'beam'}, 'mode'),
    ({'dtype': 'int8'}, 'dtype'),
    ({'device': 'tpu'}, 'device'),
    ({'max_inflight': 0}, 'max_inflight'),
    ({'tree_depth': 0}, 'tree_depth'),
    ({'use_kernels': 'maybe'}, 'use_kernels'),
])
def test_engine_config_validation_names_the_field(options, field):
    with pytest.raises(ValueError, match=field):
        EngineConfig.from_dict(options)


def test_from_pretrained_validates_options_before_loading(tmp_path):
    # The folder does not exist: the option error must come first, naming the option.
    with pytest.raises(ValueError, match='max_inflght'):
        VLAPolicy.from_pretrained(str(tmp_path / 'absent'), max_inflght=2)
    with pytest.raises(ValueError, match='relax_threshold'):
        VLAPolicy.from_pretrained(str(tmp_path / 'absent'), relax_threshold=999)


def test_engine_config_replace_rejects_unknown_keys():
    with pytest.raises(ValueError, match='relax'):
        EngineConfig().replace(relax=3)


def test_set_tunables_rejects_load_time_fields(policy):
    with pytest.raises(ValueError, match='dtype'):
        policy.engine.set_tunables(dtype='float64')


def test_engine_config_defaults_are_exact_and_need_no_draft_model():
    """The default is the fastest exact configuration: pipelined speculation drafting each
    stream's previous action (no draft model), strict acceptance, greedy over the whole
    vocabulary (OpenVLA parity)."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    from vla_spec_ros.engine.drafting.previous_action_drafter import PreviousActionDrafter
    cfg = EngineConfig()
    assert cfg.mode == 'pipeline_spec' and cfg.draft_path is None
    assert cfg.speculative_prefill is True
    assert cfg.restrict_to_action_tokens is False and cfg.relax_threshold == 0
    assert isinstance(load_draft_for(_StubRunner(), cfg, None), PreviousActionDrafter)


class _StubRunner:
    max_action_tokens = 7

    class codec:            # OpenVLA's one step per frame
        step_tokens = 7


# ---- validity of actions ---------------------------------------------------------------------

@pytest.fixture(scope='module')
def restricted(folder):
    return VLAPolicy.from_pretrained(str(folder), restrict_to_action_tokens=True)


def test_restrict_to_action_tokens_gives_valid_actions(restricted):
    at = restricted.engine.runner.codec
    rng = np.random.default_rng(5)
    for i in range(3):
        image = rng.integers(0, 256, (50 + i, 70, 3), dtype=np.uint8)
        result = restricted.predict(image, INSTRUCTION, 'libero_goal')
        assert result.is_valid and result.invalid_reason is None
        assert all(at.is_action_token(t) for t in result.tokens)
        assert np.all(np.abs(result.normalized) <= 1.0)
        stats = restricted.engine.norm_stats['libero_goal']['action']
        q01, q99 = np.array(stats['q01']), np.array(stats['q99'])
        x = result.normalized
        expected = np.where(stats['mask'], 0.5 * (x + 1.0) * (q99 - q01) + q01, x)
        np.testing.assert_allclose(result.action, expected, atol=1e-12)


def test_restricted_first_token_is_argmax_over_action_ids(restricted):
    runner = restricted.engine.runner
    at = runner.codec
    prompt = runner.prepare_prompt(Frame(GOOD_IMAGE, INSTRUCTION), restricted.config)
    length = prompt.embeds.shape[0]
    hidden = runner.forward(prompt.embeds, causal_batch(0, length, runner.device),
                            runner.new_cache(length))
    logits = runner.lm.logits(hidden[-1])
    expected = at.first_action_id + int(logits[at.first_action_id:at.last_action_id + 1]
                                        .argmax())
    assert restricted.predict(GOOD_IMAGE, INSTRUCTION, 'bridge_orig').tokens[0] == expected


def test_unrestricted_non_action_tokens_are_flagged(policy):
    at = policy.engine.runner.codec
    rng = np.random.default_rng(6)
    seen_invalid = False
    for _ in range(4):
        image = rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)
        result = policy.predict(image, INSTRUCTION, 'bridge_orig')
        all_actions = all(at.is_action_token(t) for t in result.tokens)
        assert result.is_valid == all_actions
        if not all_actions:
            seen_invalid = True
            assert np.all(np.isnan(result.action))          # never executable
            assert result.invalid_reason and 'non-action' in result.invalid_reason
    # Random weights put most mass outside the 256 action ids of a 1088-id vocabulary.
    assert seen_invalid


# ---- from_pretrained's names --------------------------------------------------------------

@pytest.mark.parametrize('model, drafter', [('metaworld-demo', 'PreviousActionDrafter'),
                                            ('metaworld-demo-fast', 'MergedChains')])
def test_an_empty_draft_path_is_the_families_default_draft(model, drafter):
    """'' is what the node's empty draft_path parameter means (the family's default draft);
    from_pretrained takes it the same way instead of reading '.' as a draft folder."""
    policy = VLAPolicy.from_pretrained(model, draft_path='', mode='spec')
    assert policy.config.draft_path is None
    assert type(policy.engine.strategy.drafter).__name__ == drafter
    size = policy.model_config.image_size
    image = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    reference = VLAPolicy.from_pretrained(model, mode='ar')
    key = reference.unnorm_keys[0]
    # Exact acceptance: the default draft gives AR's tokens.
    assert policy.predict(image, 'open the drawer', key).tokens == \
        reference.predict(image, 'open the drawer', key).tokens


def test_an_unknown_model_lists_each_known_name_once():
    with pytest.raises(CheckpointError) as info:
        VLAPolicy.from_pretrained('no-such-model')
    message = str(info.value)
    names = ast.literal_eval(message[message.index('(') + 1:message.rindex(')')])
    assert len(names) == len(set(names))
    assert {'metaworld-demo', 'metaworld-demo-fast', 'tiny', 'pi0fast-tiny'} <= set(names)


def test_a_stray_folder_does_not_hide_an_embedded_model(tmp_path, monkeypatch):
    """A folder of the working directory named like an embedded model or preset, without a
    config.json, is not a checkpoint: the bare name still means the embedded model."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'metaworld-demo').mkdir()
    (tmp_path / 'metaworld-demo' / 'notes.txt').write_text('not a checkpoint')
    assert resolve_checkpoint('metaworld-demo') == assets.embedded_checkpoint('metaworld-demo')
    (tmp_path / 'no-such-model').mkdir()
    with pytest.raises(CheckpointError, match='has no config.json, so it is no checkpoint'):
        resolve_checkpoint('no-such-model')


def test_a_bare_name_with_a_config_json_and_a_written_path_are_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'metaworld-demo').mkdir()
    assert resolve_checkpoint('./metaworld-demo') == Path('./metaworld-demo')
    with pytest.raises(CheckpointError, match='config.json'):
        VLAPolicy.from_pretrained('./metaworld-demo')     # written as a path: that folder
    (tmp_path / 'metaworld-demo' / 'config.json').write_text('{}')
    assert resolve_checkpoint('metaworld-demo') == Path('metaworld-demo')
