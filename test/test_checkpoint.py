"""Checkpoint I/O in OpenVLA's Hugging Face layout (docs/openvla.md, Checkpoint layout; S8).

The expected weight key set is written out by hand from the reference's key list (timm DINOv2
with registers and LayerScale renamed ``scale_factor``, timm SigLIP with ``attn_pool``, the
fused-GELU projector and HF Llama), for the tiny dims and for the real 7B dims (982 keys, 43 of
them unused). Every corruption below must fail with a ``ValueError`` naming the file or key.
"""
import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from vla_spec_ros import assets, cli
from vla_spec_ros.models.openvla.checkpoint import (CheckpointError, config_from_json,
                                                    config_to_json, load_model, save_model)
from vla_spec_ros.models.openvla.vision import unused_vision_keys
from vla_spec_ros.models.openvla.vla import OpenVLA
from vla_spec_ros.models.registry import preset
from vla_spec_ros.policy import VLAPolicy

OPENVLA_TIMM_IDS = ['vit_large_patch14_reg4_dinov2.lvd142m', 'vit_so400m_patch14_siglip_224']
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json')


def _linear(name):
    return [f'{name}.weight', f'{name}.bias']


def expected_keys(dino_depth: int, siglip_depth: int, num_layers: int) -> tuple[set, set]:
    """(all keys, unused keys) of an OpenVLA checkpoint (docs/openvla.md, Checkpoint layout)."""
    keys, unused = set(), set()
    dino = 'vision_backbone.featurizer.'
    keys |= {dino + k for k in ('cls_token', 'reg_token', 'pos_embed')}
    keys |= {dino + k for k in _linear('patch_embed.proj') + _linear('norm')}
    for i in range(dino_depth):
        block = [f'blocks.{i}.{k}' for k in _linear('norm1') + _linear('attn.qkv')
                 + _linear('attn.proj') + ['ls1.scale_factor'] + _linear('norm2')
                 + _linear('mlp.fc1') + _linear('mlp.fc2') + ['ls2.scale_factor']]
        keys |= {dino + k for k in block}
        if i == dino_depth - 1:
            unused |= {dino + k for k in block}
    unused |= {dino + k for k in _linear('norm')}
    sig = 'vision_backbone.fused_featurizer.'
    keys |= {sig + 'pos_embed'} | {sig + k for k in _linear('patch_embed.proj') + _linear('norm')}
    for i in range(siglip_depth):
        block = [f'blocks.{i}.{k}' for k in _linear('norm1') + _linear('attn.qkv')
                 + _linear('attn.proj') + _linear('norm2') + _linear('mlp.fc1')
                 + _linear('mlp.fc2')]
        keys |= {sig + k for k in block}
        if i == siglip_depth - 1:
            unused |= {sig + k for k in block}
    pool = {sig + 'attn_pool.' + k for k in ['latent'] + _linear('q') + _linear('kv')
            + _linear('proj') + _linear('norm') + _linear('mlp.fc1') + _linear('mlp.fc2')}
    keys |= pool
    unused |= pool | {sig + k for k in _linear('norm')}
    keys |= {f'projector.{k}' for k in _linear('fc1') + _linear('fc2') + _linear('fc3')}
    lm = 'language_model.'
    keys |= {lm + 'model.embed_tokens.weight', lm + 'model.norm.weight', lm + 'lm_head.weight'}
    for i in range(num_layers):
        layer = f'{lm}model.layers.{i}.'
        keys |= {layer + f'self_attn.{p}_proj.weight' for p in 'qkvo'}
        keys |= {layer + f'mlp.{p}_proj.weight' for p in ('gate', 'up', 'down')}
        keys |= {layer + 'input_layernorm.weight', layer + 'post_attention_layernorm.weight'}
    return keys, unused


def _header_keys(path: Path) -> set:
    with safe_open(str(path), framework='pt') as f:
        return set(f.keys())


@pytest.fixture(scope='module')
def made(tmp_path_factory):
    """A tiny checkpoint written through the CLI (single file)."""
    out = tmp_path_factory.mktemp('ckpt') / 'tiny'
    assert cli.main(['make-checkpoint', '--preset', 'tiny', '--out', str(out)]) == 0
    return out


@pytest.fixture(scope='module')
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp('ckpt') / 'tiny-sharded'
    assert cli.main(['make-checkpoint', '--preset', 'tiny', '--out', str(out),
                     '--max-shard-mb', '0.25']) == 0
    return out


@pytest.fixture(scope='module')
def images():
    rng = np.random.default_rng(7)
    return [rng.integers(0, 256, (64, 48, 3), dtype=np.uint8) for _ in range(2)]


@pytest.fixture(scope='module')
def reference_tokens(made, images):
    policy = VLAPolicy.from_pretrained(str(made))
    return [policy.predict(im, 'pick up the red cup', 'bridge_orig').tokens for im in images]


@pytest.fixture
def copy_of(made, tmp_path):
    def copy(source=None):
        dst = tmp_path / 'copy'
        shutil.copytree(source or made, dst)
        return dst
    return copy


# ---- layout ----------------------------------------------------------------------------------

def test_config_json_layout(made):
    cfg = preset('tiny')
    config = json.loads((made / 'config.json').read_text())
    assert config['model_type'] == 'openvla'
    assert config['use_fused_vision_backbone'] is True
    assert config['arch_specifier'] == 'no-align+fused-gelu-mlp'
    assert config['n_action_bins'] == 256
    assert config['pad_to_multiple_of'] == 64
    assert config['pad_token_id'] == 1024
    assert config['image_sizes'] == [56, 56]
    assert config['timm_model_ids'] == OPENVLA_TIMM_IDS
    text = config['text_config']
    assert text['model_type'] == 'llama'
    assert (text['vocab_size'], text['hidden_size'], text['num_hidden_layers'],
            text['num_attention_heads'], text['intermediate_size']) == (1088, 64, 2, 4, 160)
    assert text['rms_norm_eps'] == cfg.llm.rms_norm_eps
    norm_stats = config['norm_stats']
    assert len(norm_stats) >= 2
    for entry in norm_stats.values():
        action = entry['action']
        for field in ('mean', 'std', 'max', 'min', 'q01', 'q99', 'mask'):
            assert len(action[field]) == 7, field
        assert all(lo <= hi for lo, hi in zip(action['q01'], action['q99']))
        assert action['mask'][-1] is False          # EEF_POS: the gripper is not normalised
    stats = json.loads((made / 'dataset_statistics.json').read_text())
    assert stats == norm_stats
    assert not list(made.glob('*.py')) and not list(made.glob('*.bin'))   # no remote code


def test_tokenizer_files(made):
    for name in TOKENIZER_FILES:
        assert (made / name).is_file(), name
    tok = Tokenizer.from_file(str(made / 'tokenizer.json'))
    assert tok.get_vocab_size() == 1025                 # 1024 ids + <PAD>
    assert tok.token_to_id('<PAD>') == 1024
    assert tok.token_to_id('<s>') == 1
    assert tok.token_to_id('\u2581') is not None
    from transformers import AutoTokenizer
    hf = AutoTokenizer.from_pretrained(str(made))       # local files only, no remote code
    text = 'In: What action should the robot take to open the drawer?\nOut:'
    assert hf(text).input_ids == tok.encode(text).ids


def test_exact_weight_keys_tiny(made):
    cfg = preset('tiny')
    keys, unused = expected_keys(cfg.featurizer.depth, cfg.fused_featurizer.depth,
                                 cfg.llm.num_layers)
    assert _header_keys(made / 'model.safetensors') == keys
    assert set(unused_vision_keys(cfg)) == unused
    state = load_file(str(made / 'model.safetensors'))
    d, g, h = cfg.featurizer.embed_dim, cfg.fused_featurizer.embed_dim, cfg.llm.hidden_size
    assert state['vision_backbone.featurizer.pos_embed'].shape == (1, 16, d)
    assert state['vision_backbone.featurizer.reg_token'].shape == (1, 4, d)
    assert state['vision_backbone.featurizer.patch_embed.proj.weight'].shape == (d, 3, 14, 14)
    assert state['vision_backbone.fused_featurizer.attn_pool.latent'].shape == (1, 1, g)
    assert state['projector.fc1.weight'].shape == (4 * (d + g), d + g)
    assert state['projector.fc3.weight'].shape == (h, h)
    assert state['language_model.model.embed_tokens.weight'].shape == (1088, h)
    assert state['language_model.lm_head.weight'].shape == (1088, h)
    assert all(t.dtype == torch.float32 for t in state.values())


def test_exact_weight_keys_openvla_7b():
    cfg = preset('openvla-7b')
    keys, unused = expected_keys(24, 27, 32)
    assert len(keys) == 982 and len(unused) == 43       # docs/openvla.md, Checkpoint layout
    with torch.device('meta'):
        model = OpenVLA(cfg)
    consumed = set(model.state_dict())
    assert consumed == keys - unused
    assert set(unused_vision_keys(cfg)) == unused


def test_sharded_layout_and_tokens(sharded, images, reference_tokens):
    index = json.loads((sharded / 'model.safetensors.index.json').read_text())
    assert not (sharded / 'model.safetensors').exists()
    weight_map = index['weight_map']
    shards = sorted(set(weight_map.values()))
    assert len(shards) >= 2
    assert sorted(p.name for p in sharded.glob('*.safetensors')) == shards
    cfg = preset('tiny')
    assert set(weight_map) == expected_keys(3, 3, cfg.llm.num_layers)[0]
    total = 0
    for shard in shards:
        listed = {k for k, v in weight_map.items() if v == shard}
        assert _header_keys(sharded / shard) == listed
        total += sum(t.numel() * t.element_size() for t in load_file(str(sharded / shard))
                     .values())
    assert index['metadata']['total_size'] == total
    policy = VLAPolicy.from_pretrained(str(sharded))
    tokens = [policy.predict(im, 'pick up the red cup', 'bridge_orig').tokens for im in images]
    assert tokens == reference_tokens                    # same seed, same weights


def test_round_trip(made, images, reference_tokens, tmp_path):
    model, cfg, raw = load_model(made)
    first = VLAPolicy.from_pretrained(str(made))
    assert [first.predict(im, 'pick up the red cup', 'bridge_orig').tokens
            for im in images] == reference_tokens
    for target, shard in ((tmp_path / 'single', None), (tmp_path / 'sharded', 300_000)):
        save_model(model, cfg, target, raw['norm_stats'], max_shard_bytes=shard)
        for name in TOKENIZER_FILES:
            shutil.copy(made / name, target / name)
        again, cfg2, raw2 = load_model(target)
        assert cfg2 == cfg
        assert raw2['norm_stats'] == raw['norm_stats']
        for key, value in model.state_dict().items():
            assert torch.equal(again.state_dict()[key], value), key
        policy = VLAPolicy.from_pretrained(str(target))
        tokens = [policy.predict(im, 'pick up the red cup', 'bridge_orig').tokens
                  for im in images]
        assert tokens == reference_tokens
    assert (tmp_path / 'sharded' / 'model.safetensors.index.json').is_file()


def test_config_json_round_trip():
    for name in ('tiny', 'openvla-7b'):
        cfg = preset(name)
        assert config_from_json(config_to_json(cfg, {})) == cfg


def test_norm_stats_fall_back_to_dataset_statistics(copy_of):
    folder = copy_of()
    config = json.loads((folder / 'config.json').read_text())
    del config['norm_stats']
    (folder / 'config.json').write_text(json.dumps(config))
    policy = VLAPolicy.from_pretrained(str(folder))
    assert policy.unnorm_keys == ('bridge_orig', 'libero_goal')
    (folder / 'dataset_statistics.json').unlink()
    with pytest.raises(CheckpointError, match='dataset_statistics.json'):
        VLAPolicy.from_pretrained(str(folder))


def _statistics_only_in_the_file(folder: Path) -> Path:
    """The folder's statistics moved out of config.json: dataset_statistics.json is read."""
    config = json.loads((folder / 'config.json').read_text())
    del config['norm_stats']
    (folder / 'config.json').write_text(json.dumps(config))
    return folder / 'dataset_statistics.json'


def _damage(action: dict, change: str) -> None:
    if change == 'swapped':
        action['q01'], action['q99'] = action['q99'], action['q01']
    elif change == 'nan':
        action['q01'][2] = float('nan')
    elif change == 'six dims':
        for name in ('q01', 'q99', 'mask', 'mean', 'std', 'min', 'max'):
            action[name] = action[name][:6]
    elif change == 'string mask':
        action['mask'] = ['no'] * len(action['q01'])
    elif change == 'negative std':
        action.update(mode='MEAN_STD', std=[-1.0] * len(action['q01']))


@pytest.mark.parametrize('change, match', [
    ('swapped', r'action q01 > q99 at dims \[0, 1, 2, 3, 4, 5, 6\]'),
    ('nan', r'action q01 is not finite at dims \[2\]'),
    ('six dims', "action statistics of 6 dims; the model's actions have 7"),
    ('string mask', 'action mask must be a list of true/false'),
    ('negative std', 'action std < 0'),
])
def test_bad_statistics_are_refused_at_load_naming_key_and_file(copy_of, change, match):
    """Each would load and then mirror, silence or fail every action at run time."""
    stats_file = _statistics_only_in_the_file(copy_of())
    stats = json.loads(stats_file.read_text())
    _damage(stats['libero_goal']['action'], change)
    stats_file.write_text(json.dumps(stats))
    with pytest.raises(ValueError, match=match) as info:
        VLAPolicy.from_pretrained(str(stats_file.parent))
    assert f"{stats_file}: norm_stats['libero_goal']" in str(info.value)


def test_bad_statistics_in_config_json_name_config_json(copy_of):
    folder = copy_of()
    config = json.loads((folder / 'config.json').read_text())
    _damage(config['norm_stats']['bridge_orig']['action'], 'swapped')
    (folder / 'config.json').write_text(json.dumps(config))
    with pytest.raises(ValueError, match=f"{folder / 'config.json'}: "
                                         r"norm_stats\['bridge_orig'\]: action q01 > q99"):
        VLAPolicy.from_pretrained(str(folder))


@pytest.mark.parametrize('text, match', [
    ('{"libero_goal": ', 'not valid JSON'),
    ('[1, 2]', 'expected a JSON object of datasets .* got a list'),
    ('{}', 'got an empty object'),
    ('{"libero_goal": [1]}', "norm_stats\\['libero_goal'\\]: malformed action statistics"),
])
def test_an_unreadable_statistics_file_is_named(copy_of, text, match):
    stats_file = _statistics_only_in_the_file(copy_of())
    stats_file.write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        VLAPolicy.from_pretrained(str(stats_file.parent))
    assert str(stats_file) in str(info.value)


def test_checkpoint_without_unused_keys_loads(copy_of):
    folder = copy_of()
    path = folder / 'model.safetensors'
    state = load_file(str(path))
    for key in unused_vision_keys(preset('tiny')):
        del state[key]
    save_file(state, str(path))
    load_model(folder)


# ---- minimal text_config (reference §1.3, §2) ------------------------------------------------

def test_minimal_text_config_falls_back_to_7b_defaults():
    data = {'model_type': 'openvla', 'use_fused_vision_backbone': True,
            'arch_specifier': 'no-align+fused-gelu-mlp', 'image_sizes': [224, 224],
            'timm_model_ids': OPENVLA_TIMM_IDS, 'pad_token_id': 32000,
            'pad_to_multiple_of': 64, 'n_action_bins': 256, 'norm_stats': {},
            'text_config': {'model_type': 'llama', 'pad_token_id': 32000,
                            'torch_dtype': 'bfloat16'}}
    cfg = config_from_json(data)
    llm = cfg.llm
    assert llm.rms_norm_eps == 1e-6
    assert (llm.hidden_size, llm.num_layers, llm.num_heads, llm.num_kv_heads,
            llm.intermediate_size) == (4096, 32, 32, 32, 11008)
    assert llm.vocab_size == 32064                      # 32001 padded to a multiple of 64
    assert llm.rope_theta == 10000.0
    assert cfg.text_vocab_size == 32000
    assert (cfg.featurizer.embed_dim, cfg.featurizer.depth, cfg.featurizer.num_register_tokens,
            cfg.fused_featurizer.embed_dim, cfg.fused_featurizer.depth) == (1024, 24, 4, 1152, 27)
    assert cfg.num_patches == 256
    data['text_config']['rms_norm_eps'] = 1e-5          # present: read, not defaulted
    assert config_from_json(data).llm.rms_norm_eps == 1e-5


@pytest.mark.parametrize('change, match', [
    ({'model_type': 'llava'}, 'model_type'),
    ({'arch_specifier': 'gelu-mlp'}, 'arch_specifier'),
    ({'timm_model_ids': ['vit_base_patch16_224', 'x']}, 'timm_model_ids'),
    ({'image_sizes': [336, 336]}, 'image_sizes'),
])
def test_unsupported_config_refused(change, match):
    data = {'model_type': 'openvla', 'timm_model_ids': OPENVLA_TIMM_IDS,
            'image_sizes': [224, 224], 'text_config': {}}
    data.update(change)
    with pytest.raises(CheckpointError, match=match):
        config_from_json(data, 'some/config.json')


# ---- errors ----------------------------------------------------------------------------------

def test_missing_folder(tmp_path):
    absent = tmp_path / 'absent'
    with pytest.raises(CheckpointError, match=str(absent)):
        load_model(absent)
    with pytest.raises(CheckpointError, match='absent'):
        VLAPolicy.from_pretrained(str(absent))


def test_missing_config_json(copy_of):
    folder = copy_of()
    (folder / 'config.json').unlink()
    with pytest.raises(CheckpointError, match='config.json'):
        load_model(folder)


def test_invalid_config_json(copy_of):
    folder = copy_of()
    (folder / 'config.json').write_text('{"model_type": "openvla",')
    with pytest.raises(CheckpointError, match='config.json'):
        load_model(folder)


@pytest.mark.parametrize('keep', [4, 100, 0.5, -1])
def test_truncated_safetensors(copy_of, keep):
    folder = copy_of()
    path = folder / 'model.safetensors'
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else keep
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError, match='model.safetensors') as info:
        load_model(folder)
    assert 'truncated' in str(info.value) or 'corrupt' in str(info.value)


def test_missing_key(copy_of):
    folder = copy_of()
    path = folder / 'model.safetensors'
    state = load_file(str(path))
    key = 'language_model.model.layers.1.mlp.up_proj.weight'
    del state[key]
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=key.replace('.', r'\.')):
        load_model(folder)


def test_unexpected_key(copy_of):
    folder = copy_of()
    path = folder / 'model.safetensors'
    state = load_file(str(path))
    key = 'language_model.model.layers.1.mlp.extra_proj.weight'
    state[key] = torch.zeros(3)
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=key.replace('.', r'\.')):
        load_model(folder)


def test_wrong_shape(copy_of):
    folder = copy_of()
    path = folder / 'model.safetensors'
    state = load_file(str(path))
    key = 'projector.fc2.weight'
    state[key] = torch.zeros(state[key].shape[0], state[key].shape[1] - 1)
    save_file(state, str(path))
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    message = str(info.value)
    assert key in message and 'model.safetensors' in message and 'shape' in message


@pytest.mark.parametrize('value', [float('nan'), float('inf')])
def test_non_finite_weight_refused(copy_of, value):
    """Before: a NaN or inf weight loaded silently and every action came out NaN."""
    folder = copy_of()
    path = folder / 'model.safetensors'
    state = load_file(str(path))
    key = 'language_model.model.layers.0.self_attn.q_proj.weight'
    state[key][1, 2] = value
    save_file(state, str(path))
    with pytest.raises(CheckpointError, match=key.replace('.', r'\.')) as info:
        load_model(folder)
    assert 'model.safetensors' in str(info.value) and 'non-finite' in str(info.value)


def test_shard_listed_in_index_but_missing(copy_of, sharded):
    folder = copy_of(sharded)
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    shard = sorted(set(index['weight_map'].values()))[-1]
    (folder / shard).unlink()
    with pytest.raises(CheckpointError, match=shard):
        load_model(folder)


def test_key_listed_in_index_but_absent_from_its_shard(copy_of, sharded):
    folder = copy_of(sharded)
    index = json.loads((folder / 'model.safetensors.index.json').read_text())
    key, shard = sorted(index['weight_map'].items())[0]
    state = load_file(str(folder / shard))
    del state[key]
    save_file(state, str(folder / shard))
    with pytest.raises(CheckpointError) as info:
        load_model(folder)
    assert key in str(info.value) and shard in str(info.value)


def test_truncated_shard(copy_of, sharded):
    folder = copy_of(sharded)
    shard = sorted(folder.glob('model-*.safetensors'))[0]
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=shard.name):
        load_model(folder)


class _Exploit:
    marker = None

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pickle_only_folder_refused_without_unpickling(copy_of, tmp_path):
    folder = copy_of()
    (folder / 'model.safetensors').unlink()
    marker = tmp_path / 'unpickled'
    exploit = _Exploit()
    exploit.marker = str(marker)
    (folder / 'pytorch_model.bin').write_bytes(pickle.dumps(exploit))
    with pytest.raises(CheckpointError, match='safetensors'):
        load_model(folder)
    assert not marker.exists()


def test_no_weights_at_all(copy_of):
    folder = copy_of()
    (folder / 'model.safetensors').unlink()
    with pytest.raises(CheckpointError, match='model.safetensors'):
        load_model(folder)


@pytest.mark.parametrize('model, donor, match', [
    ('metaworld-demo', 'metaworld-demo-reason',
     "<PAD> = id 768; config.json's pad_token_id is 512"),
    ('metaworld-demo-reason', 'metaworld-demo',
     "<PAD> = id 512; config.json's pad_token_id is 768"),
])
def test_another_checkpoints_tokenizer_is_refused(tmp_path, model, donor, match):
    """The reasoning model's tokenizer in the demo model gave maximum motion marked valid."""
    folder = tmp_path / model
    shutil.copytree(assets.embedded_checkpoint(model), folder)
    shutil.copy(assets.embedded_checkpoint(donor) / 'tokenizer.json', folder)
    with pytest.raises(CheckpointError, match=match) as info:
        VLAPolicy.from_pretrained(str(folder))
    assert str(folder / 'tokenizer.json') in str(info.value)


def test_tokenizer_ids_past_the_text_vocabulary_are_refused(copy_of):
    folder = copy_of()
    tok = Tokenizer.from_file(str(folder / 'tokenizer.json'))
    tok.add_tokens(['<extra_a>', '<extra_b>'])          # ids 1025, 1026: past V = 1024
    tok.save(str(folder / 'tokenizer.json'))
    with pytest.raises(CheckpointError, match='ids up to 1026; the model.s text vocabulary is '
                                              r'1024 ids \(vocab_size 1088 - '
                                              r'pad_to_multiple_of 64\)'):
        VLAPolicy.from_pretrained(str(folder))


def test_missing_tokenizer_named(copy_of):
    folder = copy_of()
    (folder / 'tokenizer.json').unlink()
    with pytest.raises((ValueError, FileNotFoundError), match='tokenizer.json'):
        VLAPolicy.from_pretrained(str(folder))
