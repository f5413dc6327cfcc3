"""Single-tower checkpoints (``use_fused_vision_backbone`` false: one SigLIP or DINOv2 tower and
the two-layer GELU-MLP projector of the Hugging Face port), beside OpenVLA's fused pair.

The configuration's derived facts and its checks; the weight keys and projector of the Hugging
Face layout (written here by hand, key by key); 3-channel preprocessing on both paths; a random
``tiny-siglip`` checkpoint that saves, loads and gives the AR reference tokens in every engine
mode (float64, CPU); and the loud errors for a config.json that disagrees with its weights.
"""
import json
import math
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from vla_spec_ros.config import (DINOV2_MEAN, DINOV2_STD, MODES, SIGLIP_MEAN, SIGLIP_STD,
                                 LlamaConfig, VisionTowerConfig)
from vla_spec_ros.engine.device.frame_upload import FrameUploader
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.checkpoint import (CheckpointError, config_from_json,
                                                    config_to_json, load_model, save_model)
from vla_spec_ros.models.openvla.config import VLAConfig
from vla_spec_ros.models.openvla.preprocess import preprocess_image, preprocess_pixels
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.models.openvla.vision import GeluMLP, unused_vision_keys
from vla_spec_ros.models.openvla.vla import OpenVLA
from vla_spec_ros.models.registry import preset
from vla_spec_ros.policy import VLAPolicy

from helpers import serve_streams
from reference import ar_reference_tokens

ACTION_DIM = 7
SIGLIP_224 = 'vit_so400m_patch14_siglip_224'
SIGLIP_384 = 'vit_so400m_patch14_siglip_384'
DINOV2 = 'vit_large_patch14_reg4_dinov2.lvd142m'
INSTRUCTIONS = ('pick up the red cup', 'open the drawer', 'push the blue block to the left')
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA GPU')


def _linear(name):
    return [f'{name}.weight', f'{name}.bias']


def siglip_tower_keys(depth: int) -> tuple[set, set]:
    """(all, unused) keys of a timm SigLIP tower as the Hugging Face port names them, under
    ``vision_backbone.featurizer.`` (the only tower of a single-tower checkpoint)."""
    prefix = 'vision_backbone.featurizer.'
    keys = {prefix + 'pos_embed'} | {prefix + k for k in _linear('patch_embed.proj')}
    unused = {prefix + k for k in _linear('norm')}
    for i in range(depth):
        block = {prefix + f'blocks.{i}.{k}' for k in _linear('norm1') + _linear('attn.qkv')
                 + _linear('attn.proj') + _linear('norm2') + _linear('mlp.fc1')
                 + _linear('mlp.fc2')}
        keys |= block
        if i == depth - 1:
            unused |= block
    unused |= {prefix + 'attn_pool.' + k for k in ['latent'] + _linear('q') + _linear('kv')
               + _linear('proj') + _linear('norm') + _linear('mlp.fc1')
               + _linear('mlp.fc2')}
    return keys | unused, unused


def llama_keys(num_layers: int) -> set:
    lm = 'language_model.'
    keys = {lm + 'model.embed_tokens.weight', lm + 'model.norm.weight', lm + 'lm_head.weight'}
    for i in range(num_layers):
        layer = f'{lm}model.layers.{i}.'
        keys |= {layer + f'self_attn.{p}_proj.weight' for p in 'qkvo'}
        keys |= {layer + f'mlp.{p}_proj.weight' for p in ('gate', 'up', 'down')}
        keys |= {layer + 'input_layernorm.weight', layer + 'post_attention_layernorm.weight'}
    return keys


def hf_single_tower_config(backbone_id='siglip-vit-so400m', timm_ids=(SIGLIP_224,),
                           sizes=(224,), **changes) -> dict:
    """config.json as the Hugging Face ``OpenVLAConfig`` writes it for a single tower."""
    data = {'architectures': ['OpenVLAForActionPrediction'], 'model_type': 'openvla',
            'vision_backbone_id': backbone_id, 'llm_backbone_id': 'llama2-7b-pure',
            'arch_specifier': 'no-align+gelu-mlp', 'use_fused_vision_backbone': False,
            'image_resize_strategy': 'resize-naive', 'image_sizes': list(sizes),
            'timm_model_ids': list(timm_ids), 'timm_override_act_layers': [None] * len(sizes),
            'pad_token_id': 32000, 'pad_to_multiple_of': 64, 'n_action_bins': 256,
            'norm_stats': {}, 'text_config': {'model_type': 'llama', 'pad_token_id': 32000,
                                              'torch_dtype': 'bfloat16'}}
    data.update(changes)
    return data


def _frames(num=24, repeat_every=3, seed=5):
    """Two streams; each third frame of a stream repeats its previous image and instruction
    (the previous action is then the right draft)."""
    rng = np.random.default_rng(seed)
    frames, last = [], {}
    for i in range(num):
        stream = f'cam{i % 2}'
        if stream in last and (i // 2) % repeat_every == repeat_every - 1:
            image = last[stream]
        else:
            image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
        last[stream] = image
        frames.append(Frame(image, INSTRUCTIONS[(i // 6) % len(INSTRUCTIONS)], 'bridge_orig',
                            stream, i))
    return frames


# ---- the configuration -----------------------------------------------------------------------

def test_derived_facts_of_one_and_two_towers():
    single, fused = preset('tiny-siglip'), preset('tiny')
    assert not single.is_fused and single.fused_featurizer is None
    assert single.towers == (single.featurizer,) and single.featurizer.kind == 'siglip'
    assert (single.pixel_channels, single.vision_dim, single.num_patches,
            single.image_size) == (3, 48, 16, 56)
    assert fused.is_fused and fused.towers == (fused.featurizer, fused.fused_featurizer)
    assert (fused.pixel_channels, fused.vision_dim, fused.num_patches,
            fused.image_size) == (6, 32 + 48, 16, 56)
    assert single.llm == fused.llm                       # only the vision side differs
    # SigLIP So400m/14 at 384 px: 27 x 27 patches (the 6 pixels past the last are dropped).
    tower = VisionTowerConfig('siglip', 384, 14, 1152, 27, 16, 4304)
    assert tower.num_patches == 729


def _llm():
    return LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=160,
                       vocab_size=1088)


@pytest.mark.parametrize('build, field', [
    (lambda s, d, llm: VLAConfig(featurizer={'kind': 'siglip'}, fused_featurizer=None,
                                 llm=llm, pad_token_id=1024), 'featurizer'),
    (lambda s, d, llm: VLAConfig(featurizer=d, fused_featurizer='siglip', llm=llm,
                                 pad_token_id=1024), 'fused_featurizer'),
    (lambda s, d, llm: VLAConfig(featurizer=s, fused_featurizer=None, llm={},
                                 pad_token_id=1024), 'llm'),
    (lambda s, d, llm: VLAConfig(featurizer=s, fused_featurizer=d, llm=llm,
                                 pad_token_id=1024), 'featurizer.kind'),
    (lambda s, d, llm: VLAConfig(featurizer=d, fused_featurizer=d, llm=llm,
                                 pad_token_id=1024), 'fused_featurizer.kind'),
    (lambda s, d, llm: VLAConfig(featurizer=d, llm=llm, pad_token_id=1024,
                                 fused_featurizer=VisionTowerConfig('siglip', 70, 14, 48, 3,
                                                                    2, 96)),
     'fused_featurizer'),
    (lambda s, d, llm: VisionTowerConfig('siglip', 8, 14, 48, 3, 2, 96), 'image_size'),
])
def test_inconsistent_configs_name_the_field(build, field):
    siglip = VisionTowerConfig('siglip', 56, 14, 48, 3, 2, 96, mean=SIGLIP_MEAN,
                               std=SIGLIP_STD)
    dino = VisionTowerConfig('dinov2', 56, 14, 32, 3, 2, 64, num_register_tokens=4)
    with pytest.raises(ValueError, match=f'^{field}:'):
        build(siglip, dino, _llm())


def test_a_dinov2_tower_alone_is_a_model_too():
    dino = VisionTowerConfig('dinov2', 56, 14, 32, 3, 2, 64, num_register_tokens=4,
                             mean=DINOV2_MEAN, std=DINOV2_STD)
    cfg = VLAConfig(featurizer=dino, fused_featurizer=None, llm=_llm(), pad_token_id=1024)
    model = OpenVLA(cfg).double()
    with torch.no_grad():
        out = model.image_embeddings(torch.randn(2, 3, 56, 56, dtype=torch.float64))
    assert out.shape == (2, 16, 64)                      # CLS and registers dropped
    assert config_from_json(config_to_json(cfg, {})) == cfg


# ---- the Hugging Face layout -----------------------------------------------------------------

def test_weight_keys_and_projector_are_the_hugging_face_single_tower_layout():
    cfg = preset('tiny-siglip')
    tower, unused = siglip_tower_keys(cfg.featurizer.depth)
    projector = {f'projector.{k}' for k in _linear('fc1') + _linear('fc2')}
    model = OpenVLA(cfg)
    state = model.state_dict()
    assert set(state) == (tower - unused) | projector | llama_keys(cfg.llm.num_layers)
    assert set(unused_vision_keys(cfg)) == unused and len(unused) == 27
    assert isinstance(model.projector, GeluMLP)
    assert state['projector.fc1.weight'].shape == (64, 48)     # vision_dim -> llm_dim
    assert state['projector.fc2.weight'].shape == (64, 64)     # llm_dim -> llm_dim
    assert not hasattr(model.vision_backbone, 'fused_featurizer')


@pytest.mark.parametrize('backbone_id, timm_ids, size, patches', [
    ('siglip-vit-so400m', (SIGLIP_224,), 224, 256),
    ('siglip-vit-so400m-384px', (SIGLIP_384,), 384, 729),
    ('dinov2-vit-l', (DINOV2,), 224, 256),
])
def test_hugging_face_config_of_a_real_single_tower_backbone(backbone_id, timm_ids, size,
                                                             patches):
    """A config.json as the Hugging Face port writes it (no vla_spec_vision): the timm id
    implies the tower, and the projector is fc1 (vision -> 4096), GELU, fc2 (4096 -> 4096)."""
    cfg = config_from_json(hf_single_tower_config(backbone_id, timm_ids, [size]))
    assert not cfg.is_fused and cfg.num_patches == patches and cfg.image_size == size
    width = 1152 if 'siglip' in backbone_id else 1024
    assert (cfg.featurizer.embed_dim, cfg.vision_dim) == (width, width)
    with torch.device('meta'):
        model = OpenVLA(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()
              if k.startswith('projector.')}
    assert shapes == {'projector.fc1.weight': (4096, width), 'projector.fc1.bias': (4096,),
                      'projector.fc2.weight': (4096, 4096), 'projector.fc2.bias': (4096,)}
    if 'siglip' in backbone_id:
        tower, unused = siglip_tower_keys(27)
        assert {k for k in model.state_dict() if k.startswith('vision_backbone.')} \
            == tower - unused
    written = config_to_json(cfg, {})
    assert (written['vision_backbone_id'], written['timm_model_ids'], written['image_sizes'],
            written['use_fused_vision_backbone'], written['arch_specifier']) \
        == (backbone_id, list(timm_ids), [size], False, 'no-align+gelu-mlp')
    assert 'vla_spec_vision' not in written
    assert config_from_json(written) == cfg
    # Without the flag, the Hugging Face rule: fused only for "dino*" pairs.
    data = hf_single_tower_config(backbone_id, timm_ids, [size])
    del data['use_fused_vision_backbone']
    assert config_from_json(data) == cfg


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def test_a_checkpoint_written_key_by_key_in_the_hugging_face_layout_loads(tmp_path):
    """Weights written here under the Hugging Face names (not through save_model) load, and
    the projector computes PrismaticProjector's fc1 -> GELU -> fc2 on the tower's features."""
    cfg = preset('tiny-siglip')
    folder = make_checkpoint(cfg, tmp_path / 'made', seed=3)
    config = json.loads((folder / 'config.json').read_text())
    d, m, h = cfg.featurizer.embed_dim, cfg.featurizer.mlp_dim, cfg.llm.hidden_size
    shapes = {'vision_backbone.featurizer.pos_embed': (1, cfg.num_patches, d),
              'vision_backbone.featurizer.patch_embed.proj.weight': (d, 3, 14, 14),
              'vision_backbone.featurizer.patch_embed.proj.bias': (d,),
              'projector.fc1.weight': (h, d), 'projector.fc1.bias': (h,),
              'projector.fc2.weight': (h, h), 'projector.fc2.bias': (h,)}
    tower, _ = siglip_tower_keys(cfg.featurizer.depth)
    for key in tower - set(shapes):
        name = key.split('.', 2)[2]
        if name.startswith('attn_pool.latent'):
            shapes[key] = (1, 1, d)
        elif name.endswith(('qkv.weight', 'kv.weight')):
            shapes[key] = (3 * d if 'qkv' in name else 2 * d, d)
        elif name.endswith(('qkv.bias', 'kv.bias')):
            shapes[key] = (3 * d if 'qkv' in name else 2 * d,)
        elif name.endswith('fc1.weight'):
            shapes[key] = (m, d)
        elif name.endswith('fc1.bias'):
            shapes[key] = (m,)
        elif name.endswith('fc2.weight'):
            shapes[key] = (d, m)
        elif name.endswith(('proj.weight', 'q.weight')):
            shapes[key] = (d, d)
        else:
            shapes[key] = (d,)
    theirs = load_file(str(folder / 'model.safetensors'))     # the language model's tensors
    gen = torch.Generator().manual_seed(9)
    state = {k: v for k, v in theirs.items() if k.startswith('language_model.')}
    for key, shape in shapes.items():
        state[key] = torch.randn(shape, generator=gen) * (0.02 if len(shape) < 2 else
                                                          shape[-1] ** -0.5)
    hf = tmp_path / 'hf'
    hf.mkdir()
    save_file(state, str(hf / 'model.safetensors'))
    (hf / 'config.json').write_text(json.dumps(config))
    model, loaded, _ = load_model(hf, torch.float64)
    assert loaded == cfg
    x = torch.randn(2, cfg.num_patches, d, dtype=torch.float64)
    w = {k: v.to(torch.float64) for k, v in state.items()}
    expected = _gelu(x @ w['projector.fc1.weight'].T + w['projector.fc1.bias']) \
        @ w['projector.fc2.weight'].T + w['projector.fc2.bias']
    with torch.no_grad():
        torch.testing.assert_close(model.projector(x), expected, rtol=1e-12, atol=1e-12)
        pixels = torch.randn(1, 3, 56, 56, dtype=torch.float64)
        features = model.vision_backbone(pixels)
        assert features.shape == (1, cfg.num_patches, d)
        torch.testing.assert_close(model.image_embeddings(pixels), model.projector(features))


# ---- preprocessing ---------------------------------------------------------------------------

@pytest.mark.parametrize('shape, options', [
    ((48, 64, 3), {}), ((56, 56, 3), {}), ((56, 56, 3), {'rotate_180': True}),
    ((90, 120, 3), {'center_crop': True, 'rotate_180': True}),
])
def test_one_tower_gets_three_channels_with_its_own_statistics(shape, options):
    """The SigLIP tower alone sees exactly the fused backbone's SigLIP channels (3-5), and a
    DINOv2 tower alone its DINOv2 channels (0-2), on the CPU path and through the uploader."""
    image = np.random.default_rng(sum(shape)).integers(0, 256, shape, dtype=np.uint8)
    fused = preprocess_image(image, preset('tiny'), dtype=torch.float64, **options)
    single = preset('tiny-siglip')
    ours = preprocess_image(image, single, dtype=torch.float64, **options)
    assert ours.shape == (3, 56, 56)
    assert torch.equal(ours, fused[3:])
    uploaded = preprocess_pixels(FrameUploader('cpu').upload(image), single, **options)
    assert torch.equal(uploaded, ours)
    dino = VLAConfig(featurizer=preset('tiny').featurizer, fused_featurizer=None,
                     llm=single.llm, pad_token_id=1024)
    assert torch.equal(preprocess_image(image, dino, dtype=torch.float64, **options),
                       fused[:3])


# ---- a random single-tower checkpoint in every mode -------------------------------------------

@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_checkpoint('tiny-siglip', tmp_path_factory.mktemp('single') / 'tiny-siglip',
                           seed=4)


@pytest.fixture(scope='module')
def policy(folder):
    return VLAPolicy.from_pretrained(str(folder), dtype='float64', mode='ar')


@pytest.fixture(scope='module')
def frames_and_reference(policy):
    frames = _frames()
    return frames, ar_reference_tokens(policy, frames)


def test_config_json_and_keys_on_disk(folder):
    config = json.loads((folder / 'config.json').read_text())
    assert config['use_fused_vision_backbone'] is False
    assert config['arch_specifier'] == 'no-align+gelu-mlp'
    assert config['timm_model_ids'] == [SIGLIP_224] and config['image_sizes'] == [56]
    assert config['vla_spec_vision'] == {'featurizer': dict(
        kind='siglip', image_size=56, patch_size=14, embed_dim=48, depth=3, num_heads=2,
        mlp_dim=96, num_register_tokens=0, norm_eps=1e-6, mean=[0.5] * 3, std=[0.5] * 3)}
    cfg = preset('tiny-siglip')
    keys = set(load_file(str(folder / 'model.safetensors')))
    assert keys == siglip_tower_keys(3)[0] | {f'projector.{k}' for k in _linear('fc1')
                                              + _linear('fc2')} | llama_keys(2)
    assert not any(k.startswith('vision_backbone.fused_featurizer.') for k in keys)
    assert config_from_json(config) == cfg


def test_save_load_round_trip(folder, policy, frames_and_reference, tmp_path):
    frames, reference = frames_and_reference
    model, cfg, raw = load_model(folder, torch.float64)
    for target, shard in ((tmp_path / 'single', None), (tmp_path / 'sharded', 60_000)):
        save_model(model, cfg, target, raw['norm_stats'], max_shard_bytes=shard)
        for name in ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json'):
            shutil.copy(folder / name, target / name)
        again, cfg2, _ = load_model(target, torch.float64)
        assert cfg2 == cfg
        for key, value in model.state_dict().items():
            assert torch.equal(again.state_dict()[key], value), key
        reloaded = VLAPolicy.from_pretrained(str(target), dtype='float64', mode='ar')
        assert ar_reference_tokens(reloaded, frames[:4]) == reference[:4]


def run_saturating(engine, frames):
    """Offer a frame whenever none of its stream waits; results in request-id order, after
    checking each stream was emitted in order."""
    out = serve_streams(engine, frames)
    for stream in {f.frame.stream_id for f in out}:
        ids = [f.request_id for f in out if f.frame.stream_id == stream]
        assert ids == sorted(ids)
    return sorted(out, key=lambda f: f.request_id)


@pytest.mark.parametrize('mode, draft_path', [(m, None) for m in MODES]
                         + [('spec', 'random'), ('pipeline_spec', 'random')])
def test_every_mode_gives_the_ar_reference_tokens(folder, frames_and_reference, mode,
                                                  draft_path):
    frames, reference = frames_and_reference
    options = {} if draft_path is None else {'draft_path': draft_path}
    policy = VLAPolicy.from_pretrained(str(folder), dtype='float64', mode=mode, **options)
    assert policy.model_config.pixel_channels == 3
    out = run_saturating(policy.engine, frames)
    assert [f.frame.user_data for f in out] == list(range(len(frames)))
    assert [f.result.tokens for f in out] == reference
    accepted = [f.result.stats['prefill_accepted'] for f in out]
    if mode == 'spec' and draft_path is None:
        # The previous action drafted for a repeated image is the AR action: accepted whole
        # inside the forward that prefills the frame.
        repeats = [a for f, a in zip(out, accepted) if (f.frame.user_data // 2) % 3 == 2]
        assert repeats and min(repeats) == ACTION_DIM - 1
    elif mode == 'pipeline_spec' and draft_path is None:
        assert max(accepted) > 0        # the stream's previous frame may still be in flight


def test_predict_returns_the_reference_action(policy, frames_and_reference):
    frames, reference = frames_and_reference
    frame = frames[0]
    assert policy.predict(frame.image, frame.instruction, 'bridge_orig').tokens == reference[0]


# ---- a config.json that disagrees with its weights --------------------------------------------

def _rewrite(folder, tmp_path, change=None, state_change=None):
    target = tmp_path / 'changed'
    shutil.copytree(folder, target)
    if change is not None:
        config = json.loads((target / 'config.json').read_text())
        change(config)
        (target / 'config.json').write_text(json.dumps(config))
    if state_change is not None:
        state = load_file(str(target / 'model.safetensors'))
        state_change(state)
        save_file(state, str(target / 'model.safetensors'))
    return target


def _fused_flag_over_one_tower(config):
    """config.json of the fused ``tiny`` preset over the single tower's weights."""
    fused = config_to_json(preset('tiny'), config['norm_stats'])
    config.clear()
    config.update(fused)


def _single_flag_over_two_towers(config):
    config.update(use_fused_vision_backbone=False, arch_specifier='no-align+gelu-mlp',
                  timm_model_ids=[DINOV2], image_sizes=[56], timm_override_act_layers=[None])
    del config['vla_spec_vision']['fused_featurizer']


def test_fused_flag_over_one_towers_weights_is_refused(folder, tmp_path):
    target = _rewrite(folder, tmp_path, _fused_flag_over_one_tower)
    with pytest.raises(CheckpointError, match='use_fused_vision_backbone is true.*one vision '
                       'tower'):
        load_model(target)


def test_single_flag_over_two_towers_weights_is_refused(tmp_path):
    fused = make_checkpoint('tiny', tmp_path / 'fused', seed=0)
    target = _rewrite(fused, tmp_path, _single_flag_over_two_towers)
    with pytest.raises(CheckpointError, match='use_fused_vision_backbone is false.*second '
                       'vision tower'):
        load_model(target)


def test_a_fused_projector_over_one_tower_is_refused(folder, tmp_path):
    def add_fc3(state):
        state['projector.fc3.weight'] = torch.zeros(64, 64)
        state['projector.fc3.bias'] = torch.zeros(64)
    target = _rewrite(folder, tmp_path, state_change=add_fc3)
    with pytest.raises(CheckpointError, match='projector has three layers'):
        load_model(target)


@pytest.mark.parametrize('change, match', [
    ({'use_fused_vision_backbone': True}, 'arch_specifier'),
    ({'use_fused_vision_backbone': True, 'arch_specifier': 'no-align+fused-gelu-mlp'},
     'timm_model_ids lists 1 tower'),
    ({'timm_model_ids': [DINOV2, SIGLIP_224], 'image_sizes': [224, 224]},
     'use_fused_vision_backbone is false but timm_model_ids lists 2 towers'),
    ({'arch_specifier': 'no-align+fused-gelu-mlp'}, 'arch_specifier'),
    ({'arch_specifier': 'linear'}, 'arch_specifier'),
    ({'use_fused_vision_backbone': 'no'}, 'use_fused_vision_backbone'),
    ({'image_sizes': [224, 224]}, 'image_sizes'),
    ({'image_sizes': [384]}, 'image_sizes'),
    ({'timm_model_ids': ['vit_large_patch14_clip_224.openai']}, 'timm_model_ids'),
    ({'image_resize_strategy': 'letterbox'}, 'image_resize_strategy'),
])
def test_inconsistent_single_tower_config_json_is_refused(change, match):
    data = hf_single_tower_config(**change)
    with pytest.raises(CheckpointError, match=match):
        config_from_json(data, 'some/config.json')


def test_vla_spec_vision_must_agree_with_the_flag(folder):
    config = json.loads((folder / 'config.json').read_text())
    config['use_fused_vision_backbone'] = True
    config['arch_specifier'] = 'no-align+fused-gelu-mlp'
    with pytest.raises(CheckpointError, match='vla_spec_vision describes one tower'):
        config_from_json(config)


# ---- the GPU side -----------------------------------------------------------------------------

@needs_cuda
def test_parallel_towers_with_one_tower_is_the_model(folder):
    from vla_spec_ros.models.openvla.parallel_towers import ParallelTowers
    model, cfg, _ = load_model(folder, torch.float64, 'cuda')
    towers = ParallelTowers(model, 'cuda')
    assert towers.side is None
    image = np.random.default_rng(0).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    pixels = preprocess_pixels(FrameUploader('cuda').upload(image), cfg)
    torch.testing.assert_close(pixels.cpu(), preprocess_image(image, cfg, dtype=torch.float64),
                               rtol=0, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(towers(pixels[None]), model.image_embeddings(pixels[None]),
                                   rtol=0, atol=0)
