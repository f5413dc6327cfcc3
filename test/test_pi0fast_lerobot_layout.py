"""pi0-FAST checkpoints as LeRobot 0.6.1 writes and reads them (issue 38): weight keys, the LM
head, config.json, statistics and normalisation, the two prompt styles, the frame end and the
image resize. The expected names and formulas are LeRobot's (its source, listed here), not
this package's writer's."""
import json
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vla_spec_ros.actions import ActionStats
from vla_spec_ros.instruction import PromptError
from vla_spec_ros.models import registry
from vla_spec_ros.models.pi0fast.checkpoint import LEROBOT_PREFIX
from vla_spec_ros.models.pi0fast.family import make_random
from vla_spec_ros.models.pi0fast.model import Pi0Fast
from vla_spec_ros.models.pi0fast.statistics import (
    POSTPROCESSOR_FILE, PREPROCESSOR_FILE, CheckpointStatistics, StateNormalizer,
    read_statistics, write_statistics)
from vla_spec_ros.models.weights import CheckpointError

# LeRobot 0.6.1's PI0FastPolicy(...).state_dict() keys (transformers 5.5.4), after the prefix
# model.paligemma_with_expert.paligemma.; "N" is a layer index.
LEROBOT_KEYS = [
    'lm_head.weight',
    'model.language_model.embed_tokens.weight',
    'model.language_model.layers.N.input_layernorm.weight',
    'model.language_model.layers.N.mlp.down_proj.weight',
    'model.language_model.layers.N.mlp.gate_proj.weight',
    'model.language_model.layers.N.mlp.up_proj.weight',
    'model.language_model.layers.N.post_attention_layernorm.weight',
    'model.language_model.layers.N.self_attn.k_proj.weight',
    'model.language_model.layers.N.self_attn.o_proj.weight',
    'model.language_model.layers.N.self_attn.q_proj.weight',
    'model.language_model.layers.N.self_attn.v_proj.weight',
    'model.language_model.norm.weight',
    'model.multi_modal_projector.linear.bias',
    'model.multi_modal_projector.linear.weight',
    'model.vision_tower.vision_model.embeddings.patch_embedding.bias',
    'model.vision_tower.vision_model.embeddings.patch_embedding.weight',
    'model.vision_tower.vision_model.embeddings.position_embedding.weight',
    'model.vision_tower.vision_model.encoder.layers.N.layer_norm1.bias',
    'model.vision_tower.vision_model.encoder.layers.N.layer_norm1.weight',
    'model.vision_tower.vision_model.encoder.layers.N.layer_norm2.bias',
    'model.vision_tower.vision_model.encoder.layers.N.layer_norm2.weight',
    'model.vision_tower.vision_model.encoder.layers.N.mlp.fc1.bias',
    'model.vision_tower.vision_model.encoder.layers.N.mlp.fc1.weight',
    'model.vision_tower.vision_model.encoder.layers.N.mlp.fc2.bias',
    'model.vision_tower.vision_model.encoder.layers.N.mlp.fc2.weight',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.k_proj.bias',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.k_proj.weight',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.out_proj.bias',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.out_proj.weight',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.q_proj.bias',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.q_proj.weight',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.v_proj.bias',
    'model.vision_tower.vision_model.encoder.layers.N.self_attn.v_proj.weight',
    'model.vision_tower.vision_model.post_layernorm.bias',
    'model.vision_tower.vision_model.post_layernorm.weight',
]

# The fields of LeRobot 0.6.1's PI0FastConfig and its PreTrainedConfig base (draccus refuses
# any other field of config.json).
LEROBOT_CONFIG_FIELDS = {
    'type', 'n_obs_steps', 'input_features', 'output_features', 'device', 'use_amp', 'use_peft',
    'push_to_hub', 'repo_id', 'private', 'tags', 'license', 'pretrained_path',
    'pretrained_revision', 'paligemma_variant', 'action_expert_variant', 'dtype', 'chunk_size',
    'n_action_steps', 'max_state_dim', 'max_action_dim', 'max_action_tokens',
    'use_relative_actions', 'relative_exclude_joints', 'action_feature_names', 'rtc_config',
    'image_resolution', 'empty_cameras', 'tokenizer_max_length', 'text_tokenizer_name',
    'action_tokenizer_name', 'temperature', 'max_decoding_steps', 'fast_skip_tokens',
    'validate_action_token_prefix', 'use_kv_cache', 'normalization_mapping',
    'gradient_checkpointing', 'compile_model', 'compile_mode', 'optimizer_lr',
    'optimizer_betas', 'optimizer_eps', 'optimizer_weight_decay', 'optimizer_grad_clip_norm',
    'scheduler_warmup_steps', 'scheduler_decay_steps', 'scheduler_decay_lr'}


def lerobot_keys(num_lm_layers: int, num_vision_layers: int) -> set:
    keys = set()
    for stem in LEROBOT_KEYS:
        layers = num_vision_layers if 'encoder.layers' in stem else num_lm_layers
        names = [stem.replace('.N.', f'.{i}.') for i in range(layers)] if '.N.' in stem \
            else [stem]
        keys.update(LEROBOT_PREFIX + n for n in names)
    return keys


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return registry.make_checkpoint('pi0fast-tiny', tmp_path_factory.mktemp('ck'), seed=4)


@pytest.fixture
def copy(folder, tmp_path):
    out = tmp_path / 'copy'
    shutil.copytree(folder, out)
    return out


# ---- weights ------------------------------------------------------------------------------

def test_the_file_has_exactly_lerobots_keys(folder):
    state = load_file(str(folder / 'model.safetensors'))
    assert set(state) == lerobot_keys(2, 2)
    head, table = (state[LEROBOT_PREFIX + k] for k in LEROBOT_KEYS[:2])
    assert torch.equal(head, table)                        # an explicit head, the table's values
    model = registry.load(folder).model.language_model
    assert model.lm_head.weight is model.model.embed_tokens.weight       # tied when equal


def test_a_head_other_than_the_table_is_honoured(folder, copy):
    state = load_file(str(folder / 'model.safetensors'))
    head_key, table_key = (LEROBOT_PREFIX + k for k in LEROBOT_KEYS[:2])
    state[head_key] = state[head_key] + 0.25
    save_file(state, str(copy / 'model.safetensors'))
    lm = registry.load(copy).model.language_model
    assert lm.lm_head.weight is not lm.model.embed_tokens.weight
    assert torch.equal(lm.lm_head.weight, state[head_key])
    assert torch.equal(lm.model.embed_tokens.weight, state[table_key])
    # Without embed_tokens the head is the table too (LeRobot copies it there).
    del state[table_key]
    save_file(state, str(copy / 'model.safetensors'))
    lm = registry.load(copy).model.language_model
    assert torch.equal(lm.model.embed_tokens.weight, state[head_key])
    # Without lm_head: tied to the table.
    state = load_file(str(folder / 'model.safetensors'))
    del state[head_key]
    save_file(state, str(copy / 'model.safetensors'))
    lm = registry.load(copy).model.language_model
    assert lm.lm_head.weight is lm.model.embed_tokens.weight


def test_this_packages_former_vision_keys_are_refused(folder, copy):
    state = {k.replace('model.vision_tower.vision_model.', 'model.vision_tower.vm.'): v
             for k, v in load_file(str(folder / 'model.safetensors')).items()}
    save_file(state, str(copy / 'model.safetensors'))
    with pytest.raises(CheckpointError, match='missing key'):
        registry.load(copy)


# ---- config.json --------------------------------------------------------------------------

def test_config_json_holds_only_lerobot_fields(folder):
    raw = json.loads((folder / 'config.json').read_text())
    assert set(raw) <= LEROBOT_CONFIG_FIELDS
    assert raw['type'] == 'pi0_fast' and raw['image_resolution'] == [28, 28]
    assert (folder / raw['text_tokenizer_name'] / 'tokenizer.json').is_file()
    assert (folder / raw['action_tokenizer_name'] / 'tokenizer.json').is_file()
    assert raw['normalization_mapping'] == {'VISUAL': 'IDENTITY', 'STATE': 'MEAN_STD',
                                            'ACTION': 'MEAN_STD'}
    assert json.loads((folder / 'vla_spec_pi0fast.json').read_text()) == {'style': 'lerobot'}


def test_relative_actions_are_refused(copy):
    raw = json.loads((copy / 'config.json').read_text())
    raw['use_relative_actions'] = True
    (copy / 'config.json').write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match='use_relative_actions'):
        registry.load(copy)


def test_the_text_tokenizer_counts_its_placeholders(folder):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(folder / 'paligemma_tokenizer' / 'tokenizer.json'))
    assert tok.get_vocab_size(with_added_tokens=False) == 1024      # LeRobot's vocab_size
    transformers = pytest.importorskip('transformers')
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(folder / 'paligemma_tokenizer' / 'tokenizer.json'))
    assert hf.vocab_size == 1024


def test_a_text_tokenizer_of_another_size_is_refused(copy):
    """LeRobot maps FAST ids through the text tokenizer's vocab_size, this package through the
    model's: a 2048-id tokenizer in a 1024-id model is refused, naming the file."""
    from vla_spec_ros.models.pi0fast.prompt import build_text_tokenizer
    path = copy / 'paligemma_tokenizer' / 'tokenizer.json'
    build_text_tokenizer(2048).save(str(path))
    with pytest.raises(CheckpointError, match="text tokenizer has 2048 ids; the model's "
                                              'vocab_size is 1024') as info:
        registry.load(copy)
    assert str(path) in str(info.value)


def test_the_earlier_layout_may_count_added_placeholders(copy):
    """tokenizer.json beside config.json (no named folder; LeRobot cannot read it) whose
    placeholders are added tokens: the whole tokenizer is the model's 1024 ids."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(copy / 'paligemma_tokenizer' / 'tokenizer.json'))
    data = json.loads(tok.to_str())
    vocab = data['model']['vocab']
    placeholders = sorted((i, t) for t, i in vocab.items() if t.startswith('<unused_'))
    for _, token in placeholders:
        del vocab[token]
    data['added_tokens'] += [{'id': i, 'content': t, 'single_word': False, 'lstrip': False,
                              'rstrip': False, 'normalized': False, 'special': True}
                             for i, t in placeholders]
    shutil.rmtree(copy / 'paligemma_tokenizer')
    (copy / 'tokenizer.json').write_text(json.dumps(data))
    tok = Tokenizer.from_file(str(copy / 'tokenizer.json'))
    assert tok.get_vocab_size(with_added_tokens=False) < 1024
    assert tok.get_vocab_size(with_added_tokens=True) == 1024
    assert registry.load(copy).model.vocab_size == 1024


# ---- statistics ---------------------------------------------------------------------------

def test_statistics_are_lerobots_processor_files(folder):
    pre = json.loads((folder / PREPROCESSOR_FILE).read_text())
    step = next(s for s in pre['steps'] if s['registry_name'] == 'normalizer_processor')
    assert step['state_file'] == 'policy_preprocessor_step_3_normalizer_processor.safetensors'
    names = set(load_file(str(folder / step['state_file'])))
    assert names == {f'{f}.{n}' for f in ('action', 'observation.state')
                     for n in ('mean', 'std', 'min', 'max', 'q01', 'q99')}
    post = json.loads((folder / POSTPROCESSOR_FILE).read_text())
    assert post['steps'][0]['state_file'] == \
        'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
    loaded = registry.load(folder)
    assert list(loaded.norm_stats) == ['default']
    assert loaded.norm_stats['default']['action']['mode'] == 'MEAN_STD'


def test_the_modes_come_from_the_processor_files(copy):
    raw = json.loads((copy / 'config.json').read_text())
    for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        data = json.loads((copy / name).read_text())
        data['steps'][0 if name == POSTPROCESSOR_FILE else 3]['config']['norm_map'].update(
            STATE='QUANTILES', ACTION='MIN_MAX')
        (copy / name).write_text(json.dumps(data))
    stats = read_statistics(copy, raw, 4, 3)
    assert (stats.state_mode, stats.action_mode) == ('QUANTILES', 'MIN_MAX')
    # Without the JSON files: the safetensors by name, the modes from config.json.
    for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
        (copy / name).unlink()
    raw['normalization_mapping'] = {'STATE': 'IDENTITY', 'ACTION': 'QUANTILES'}
    stats = read_statistics(copy, raw, 4, 3)
    assert (stats.state_mode, stats.action_mode) == ('IDENTITY', 'QUANTILES')
    assert stats.state_normalizer() is None
    with pytest.raises(CheckpointError, match='statistics of'):
        read_statistics(copy, raw, 5, 3)


def test_action_unnormalisation_by_hand():
    mean, std = np.array([1.0, -2.0]), np.array([0.5, 4.0])
    q01, q99 = np.array([-1.0, 0.0]), np.array([3.0, 10.0])
    x = np.array([[0.5, -1.0], [2.0, 0.25]])
    entry = {'action': {'mode': 'MEAN_STD', 'mean': mean, 'std': std, 'q01': q01,
                        'q99': q99}}
    stats = ActionStats.from_norm_stats(entry, 'k')
    np.testing.assert_allclose(stats.unnormalize(x), [[1.25, -6.0], [2.0, -1.0]])
    np.testing.assert_allclose(stats.normalize([[1.25, -6.0]]), [[0.5, -1.0]], atol=1e-7)
    entry['action']['mode'] = 'QUANTILES'
    np.testing.assert_allclose(ActionStats.from_norm_stats(entry, 'k').unnormalize(x),
                               [[2.0, 0.0], [5.0, 6.25]])
    entry['action'].update(mode='MIN_MAX', min=[0.0, 0.0], max=[2.0, 8.0])
    np.testing.assert_allclose(ActionStats.from_norm_stats(entry, 'k').unnormalize(x),
                               [[1.5, 0.0], [3.0, 5.0]])
    with pytest.raises(ValueError, match='action mode'):
        ActionStats.from_norm_stats({'action': {'mode': 'ZSCORE', 'mean': mean}}, 'k')


def test_the_engine_unnormalises_with_the_checkpoints_mode(tmp_path):
    from vla_spec_ros.policy import VLAPolicy
    folder = registry.make_checkpoint('pi0fast-tiny', tmp_path / 'ck', seed=4)
    policy = VLAPolicy.from_pretrained(str(folder), mode='ar', dtype='float64')
    codec = policy.engine.runner.codec
    stats = policy.engine._stats['default']
    assert stats.mode == 'MEAN_STD'
    chunk = np.linspace(-0.8, 0.8, int(np.prod(codec.action_shape))).reshape(codec.action_shape)
    normalised = codec.decode(codec.encode(chunk)).normalized
    action = stats.unnormalize(normalised)          # what the engine applies to a frame
    raw = load_file(str(folder / 'policy_postprocessor_step_0_unnormalizer_processor'
                                 '.safetensors'))
    np.testing.assert_allclose(action, normalised * raw['action.std'].numpy()
                               + raw['action.mean'].numpy(), rtol=1e-6)


def test_bad_processor_statistics_are_refused_at_load(tmp_path):
    """A NaN in the unnormaliser's std would void every chunk at run time: refused when the
    policy is built, naming the checkpoint and the statistics' key."""
    from vla_spec_ros.policy import VLAPolicy
    folder = registry.make_checkpoint('pi0fast-tiny', tmp_path / 'ck', seed=4)
    path = folder / 'policy_postprocessor_step_0_unnormalizer_processor.safetensors'
    tensors = load_file(str(path))
    tensors['action.std'][1] = float('nan')
    save_file(tensors, str(path))
    with pytest.raises(ValueError, match=r"norm_stats\['default'\]: action std is not "
                                         r"finite at dims \[1\]") as info:
        VLAPolicy.from_pretrained(str(folder), mode='ar')
    assert str(folder) in str(info.value)


# ---- prompt styles ------------------------------------------------------------------------

def _prompt_and_tok(folder):
    loaded = registry.load(folder)
    return loaded.tokenizer, loaded.tokenizer.tokenizer


def expected_ids(tok, text, second_bos):
    bos = tok.token_to_id('<bos>')
    return [bos] + tok.encode(text, add_special_tokens=False).ids + ([bos] if second_bos else [])


def test_the_lerobot_prompt_by_hand(folder):
    prompt, tok = _prompt_and_tok(folder)
    stats = load_file(str(folder / 'policy_preprocessor_step_3_normalizer_processor'
                                   '.safetensors'))
    mean, std = stats['observation.state.mean'].numpy(), stats['observation.state.std'].numpy()
    # Normalised targets 0.5 (bin 192), -1.0 (bin 0), -1.5 (bin -1), 1.2 (bin 255).
    state = mean.astype(np.float64) + std.astype(np.float64) * np.array([0.5, -1.0, -1.5, 1.2])
    bins = prompt.state_bins(state)
    assert bins.tolist() == [192, 0, -1, 255]
    ids = prompt.encode('  Pick_up the Red cup\n', state)
    assert ids == expected_ids(tok, 'Task: Pick up the Red cup, State: 192 0 -1 255;\n', True)
    assert prompt.encode('open the drawer') == expected_ids(
        tok, 'Task: open the drawer, State: 128 128 128 128;\n', True)
    with pytest.raises(PromptError, match='dimensions'):
        prompt.encode('open the drawer', state[:3])


def test_the_openpi_prompt_by_hand(tmp_path):
    folder = make_random('pi0fast-tiny', tmp_path / 'openpi', seed=4, style='openpi')
    loaded = registry.load(folder)
    prompt, tok = loaded.tokenizer, loaded.tokenizer.tokenizer
    assert loaded.model.style == 'openpi'
    # The openpi style pads to max_state_dim (8 here) and lower-cases; the same statistics
    # normalise the state when the checkpoint has them.
    state = prompt.state_normalizer.stats['mean'].astype(np.float64)
    assert prompt.encode('Pick up the Red cup', state) == expected_ids(
        tok, 'Task: pick up the red cup, State: 128 128 128 128 128 128 128 128;\n', False)
    bar, eos = tok.token_to_id('▁|'), tok.token_to_id('<eos>')
    codec = loaded.codec
    assert codec.end_token == eos and len(codec.suffix_tokens) == 1 and bar != eos


def test_the_lerobot_frame_ends_at_the_bar(folder):
    loaded = registry.load(folder)
    bar = loaded.tokenizer.text_ids('|')
    assert loaded.codec.suffix_tokens == () and (loaded.codec.end_token,) == tuple(bar)
    assert loaded.tokenizer.eos_id not in loaded.codec.text_tokens


def test_state_normalizer_is_lerobots_float32_formula():
    stats = {'mean': np.array([0.1, 0.2], np.float32), 'std': np.array([0.3, 0.0], np.float32)}
    x = np.array([0.7, 0.2], np.float32)
    out = StateNormalizer('MEAN_STD', stats)(x)
    assert out.dtype == np.float32
    expected = (x - stats['mean']) / (stats['std'] + np.float32(1e-8))
    assert np.array_equal(out, expected)
    q = {'q01': np.array([-1, 2], np.float32), 'q99': np.array([1, 2], np.float32)}
    out = StateNormalizer('QUANTILES', q)(np.array([0.5, 2.0], np.float32))
    np.testing.assert_allclose(out, [0.5, -1.0])


def test_statistics_round_trip(tmp_path, folder):
    raw = json.loads((folder / 'config.json').read_text())
    stats = CheckpointStatistics({'mean': np.zeros(3, np.float32), 'std': np.ones(3, np.float32)},
                                 {'q01': -np.ones(4, np.float32), 'q99': np.ones(4, np.float32)},
                                 'MEAN_STD', 'QUANTILES')
    write_statistics(tmp_path, stats, raw)
    back = read_statistics(tmp_path, raw, 4, 3)
    assert (back.action_mode, back.state_mode) == ('MEAN_STD', 'QUANTILES')
    assert set(back.action) == {'mean', 'std'} and set(back.state) == {'q01', 'q99'}


# ---- images -------------------------------------------------------------------------------

def test_the_resize_follows_the_style(folder):
    cfg = registry.load(folder).cfg
    rng = np.random.default_rng(0)
    image = torch.from_numpy(rng.integers(0, 256, (40, 30, 3), dtype=np.uint8))
    lerobot, openpi = Pi0Fast.__new__(Pi0Fast), Pi0Fast.__new__(Pi0Fast)
    for model, style in ((lerobot, 'lerobot'), (openpi, 'openpi')):
        torch.nn.Module.__init__(model)
        model.cfg, model.style = cfg, style
    a, b = lerobot.preprocess(image), openpi.preprocess(image)
    assert a.shape == b.shape == (3, 28, 28)
    # openpi rounds the resized image to uint8; LeRobot keeps floats. Both pad with -1.
    assert torch.allclose(((b + 1) / 2 * 255), ((b + 1) / 2 * 255).round(), atol=1e-9)
    assert not torch.allclose(((a + 1) / 2 * 255), ((a + 1) / 2 * 255).round(), atol=1e-3)
    assert (a[:, :, 0] == -1).all() and (b[:, :, 0] == -1).all()
    assert (a - b).abs().max() <= 1.0 / 255 + 1e-5        # half a uint8 step, x 2
    # LeRobot's computation, in float32: x / 255, bilinear, clamp, centred zero pad, 2x - 1.
    x = image.permute(2, 0, 1)[None].float() / 255.0
    x = torch.nn.functional.interpolate(x, size=(28, 21), mode='bilinear',
                                        align_corners=False).clamp(0.0, 1.0)
    x = torch.nn.functional.pad(x, (3, 4, 0, 0)) * 2.0 - 1.0
    assert torch.equal(a.float(), x[0])
