"""Checkpoint I/O in OpenVLA's Hugging Face layout (docs/openvla.md, Checkpoint layout; S8).

A checkpoint folder holds ``config.json`` (model_type "openvla", ``text_config``, ``norm_stats``,
``n_action_bins``, ``pad_to_multiple_of``, ``image_sizes``), ``model.safetensors`` or shards
listed in ``model.safetensors.index.json``, ``dataset_statistics.json`` and tokenizer files.
Only safetensors are read; no code shipped with a checkpoint is ever executed. Every key is
either consumed by the model or listed in ``unused_vision_keys``; anything else is an error
naming the key and file.

Both backbones of the Hugging Face port load: OpenVLA's fused DINOv2 + SigLIP
(``use_fused_vision_backbone`` true, ``arch_specifier`` ``no-align+fused-gelu-mlp``) and a
single SigLIP or DINOv2 tower (false, ``no-align+gelu-mlp``: ``vision_backbone.featurizer.*``
only and a two-layer projector). The flag, the timm ids, the projector specifier and the
weights must agree; any disagreement is a ``CheckpointError`` saying which.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...config import LlamaConfig, VisionTowerConfig, dinov2_vit_l, siglip_so400m
from ..weights import (CheckpointError, _check_safetensors_file, _read_json,  # noqa: F401
                       load_state_dict, weight_files)
from .config import VLAConfig
from .vision import TOWER_PREFIXES, unused_vision_keys
from .vla import OpenVLA


# The timm towers this package builds (their dims are implied by the id) and the backbones
# Prismatic names from them: vision_backbone_id -> (timm ids, image size). OpenVLA-7B ships
# with the first.
DINOV2_TIMM_ID = 'vit_large_patch14_reg4_dinov2.lvd142m'
DINOV2_IMAGE_SIZES = (224, 384)
SIGLIP_TIMM_IDS = {224: 'vit_so400m_patch14_siglip_224', 384: 'vit_so400m_patch14_siglip_384'}
OPENVLA_TIMM_IDS = (DINOV2_TIMM_ID, SIGLIP_TIMM_IDS[224])
VISION_BACKBONES = {
    'dinosiglip-vit-so-224px': (OPENVLA_TIMM_IDS, 224),
    'dinosiglip-vit-so-384px': ((DINOV2_TIMM_ID, SIGLIP_TIMM_IDS[384]), 384),
    'siglip-vit-so400m': ((SIGLIP_TIMM_IDS[224],), 224),
    'siglip-vit-so400m-384px': ((SIGLIP_TIMM_IDS[384],), 384),
    'dinov2-vit-l': ((DINOV2_TIMM_ID,), 224),
}
# Projector specifiers of the Hugging Face port (Prismatic's, with or without "no-align+").
FUSED_ARCH_SPECIFIERS = ('no-align+fused-gelu-mlp', 'fused-gelu-mlp')
SINGLE_ARCH_SPECIFIERS = ('no-align+gelu-mlp', 'gelu-mlp')
# transformers' LlamaConfig defaults, used for keys a minimal ``text_config`` leaves out
# (openvla.md §1.3: rms_norm_eps falls back to 1e-6).
LLAMA_DEFAULTS = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=2048)
_DTYPES = {'F64': torch.float64, 'F32': torch.float32, 'F16': torch.float16,
           'BF16': torch.bfloat16}


def _round_up(x: int, multiple: int) -> int:
    return x if multiple <= 0 else (x + multiple - 1) // multiple * multiple


# ---- config.json <-> VLAConfig --------------------------------------------------------------

def _tower_to_dict(t: VisionTowerConfig) -> dict:
    return dict(kind=t.kind, image_size=t.image_size, patch_size=t.patch_size,
                embed_dim=t.embed_dim, depth=t.depth, num_heads=t.num_heads, mlp_dim=t.mlp_dim,
                num_register_tokens=t.num_register_tokens, norm_eps=t.norm_eps,
                mean=list(t.mean), std=list(t.std))


def _timm_tower(timm_id: str, image_size: int, source: str) -> VisionTowerConfig:
    """The tower a timm id names, at ``image_size`` (one of the sizes it is used at)."""
    if timm_id == DINOV2_TIMM_ID:
        if image_size not in DINOV2_IMAGE_SIZES:
            raise CheckpointError(f'{source}: image_sizes {image_size} for {timm_id}; '
                                  f'supported sizes are {list(DINOV2_IMAGE_SIZES)}')
        return dinov2_vit_l(image_size)
    for size, siglip_id in SIGLIP_TIMM_IDS.items():
        if timm_id == siglip_id:
            if image_size != size:
                raise CheckpointError(f'{source}: image_sizes {image_size} != {size} for '
                                      f'{timm_id}')
            return siglip_so400m(size)
    raise CheckpointError(f'{source}: unsupported timm_model_ids entry {timm_id!r}; supported: '
                          f'{[DINOV2_TIMM_ID] + list(SIGLIP_TIMM_IDS.values())}')


def _timm_id(tower: VisionTowerConfig) -> str:
    """The timm id written for a tower (a non-standard tower names its kind's nearest id; its
    dims are recorded under ``vla_spec_vision``)."""
    if tower.kind == 'dinov2':
        return DINOV2_TIMM_ID
    return SIGLIP_TIMM_IDS.get(tower.image_size, SIGLIP_TIMM_IDS[224])


def _standard_backbone_id(cfg: VLAConfig) -> str | None:
    """Prismatic's vision_backbone_id when ``cfg``'s towers are exactly that backbone's."""
    for backbone_id, (timm_ids, size) in VISION_BACKBONES.items():
        towers = tuple(_timm_tower(timm_id, size, backbone_id) for timm_id in timm_ids)
        if towers == cfg.towers:
            return backbone_id
    return None


def config_to_json(cfg: VLAConfig, norm_stats: dict, torch_dtype: str = 'float32') -> dict:
    llm = cfg.llm
    backbone_id = _standard_backbone_id(cfg)
    out = {
        'architectures': ['OpenVLAForActionPrediction'],
        'model_type': 'openvla',
        'vision_backbone_id': backbone_id or ('vla-spec-dinosiglip' if cfg.is_fused
                                              else f'vla-spec-{cfg.featurizer.kind}'),
        'llm_backbone_id': 'llama2-7b-pure',
        'arch_specifier': FUSED_ARCH_SPECIFIERS[0] if cfg.is_fused
        else SINGLE_ARCH_SPECIFIERS[0],
        'use_fused_vision_backbone': cfg.is_fused,
        'image_resize_strategy': 'resize-naive',
        'image_sizes': [tower.image_size for tower in cfg.towers],
        'timm_model_ids': [_timm_id(tower) for tower in cfg.towers],
        'timm_override_act_layers': [None for _ in cfg.towers],
        'llm_max_length': llm.max_position_embeddings,
        'pad_token_id': cfg.pad_token_id,
        'pad_to_multiple_of': cfg.pad_to_multiple_of,
        'n_action_bins': cfg.n_action_bins,
        # Not an OpenVLA key: control steps per frame of a chunked policy (absent means 1).
        'action_chunk': cfg.action_chunk,
        'norm_stats': norm_stats,
        'text_config': {
            'model_type': 'llama', 'vocab_size': llm.vocab_size,
            'hidden_size': llm.hidden_size, 'intermediate_size': llm.intermediate_size,
            'num_hidden_layers': llm.num_layers, 'num_attention_heads': llm.num_heads,
            'num_key_value_heads': llm.num_kv_heads, 'rms_norm_eps': llm.rms_norm_eps,
            'rope_theta': llm.rope_theta,
            'max_position_embeddings': llm.max_position_embeddings,
            'pad_token_id': cfg.pad_token_id, 'torch_dtype': torch_dtype,
        },
        'torch_dtype': torch_dtype,
    }
    if backbone_id is None:
        # Non-standard towers (tiny / embedded presets) record their dims explicitly; a real
        # backbone is implied by its timm ids.
        towers = {'featurizer': _tower_to_dict(cfg.featurizer)}
        if cfg.is_fused:
            towers['fused_featurizer'] = _tower_to_dict(cfg.fused_featurizer)
        out['vla_spec_vision'] = towers
    return out


def _is_fused(data: dict, source: str) -> bool:
    """``use_fused_vision_backbone``; when absent, derived as the Hugging Face port derives it
    (from ``vision_backbone_id``), else from the number of timm ids, else OpenVLA's fused."""
    flag = data.get('use_fused_vision_backbone')
    if flag is None:
        backbone_id = data.get('vision_backbone_id')
        if isinstance(backbone_id, str):
            return backbone_id.startswith(('dinoclip', 'dinosiglip', 'vla-spec-dinosiglip'))
        timm_ids = data.get('timm_model_ids')
        return len(timm_ids) == 2 if isinstance(timm_ids, (list, tuple)) else True
    if not isinstance(flag, bool):
        raise CheckpointError(f'{source}: use_fused_vision_backbone must be true or false, got '
                              f'{flag!r}')
    return flag


def _towers_from_json(data: dict, is_fused: bool, source: str) -> tuple:
    """(featurizer, fused_featurizer or None) from ``vla_spec_vision`` or the timm ids, checked
    against the fused flag."""
    flag = f'use_fused_vision_backbone is {"true" if is_fused else "false"}'
    if 'vla_spec_vision' in data:
        towers = data['vla_spec_vision']
        featurizer = VisionTowerConfig(**towers['featurizer'])
        fused = towers.get('fused_featurizer')
        if (fused is not None) != is_fused:
            raise CheckpointError(f'{source}: {flag} but vla_spec_vision describes '
                                  f'{"two towers" if fused is not None else "one tower"}')
        return featurizer, (VisionTowerConfig(**fused) if fused is not None else None)
    backbone = VISION_BACKBONES.get(data.get('vision_backbone_id'))
    timm_ids = data.get('timm_model_ids')
    if timm_ids is None:
        timm_ids = backbone[0] if backbone else OPENVLA_TIMM_IDS if is_fused else None
    if not isinstance(timm_ids, (list, tuple)) or len(timm_ids) not in (1, 2):
        raise CheckpointError(f'{source}: timm_model_ids {timm_ids!r}: expected one or two '
                              'timm model ids')
    if (len(timm_ids) == 2) != is_fused:
        raise CheckpointError(f'{source}: {flag} but timm_model_ids lists {len(timm_ids)} '
                              f'tower{"s" if len(timm_ids) > 1 else ""} ({list(timm_ids)})')
    sizes = data.get('image_sizes')
    if sizes is None:
        sizes = [backbone[1] if backbone else 224] * len(timm_ids)
    if not isinstance(sizes, (list, tuple)) or len(sizes) != len(timm_ids):
        raise CheckpointError(f'{source}: image_sizes {sizes!r} does not give one size per '
                              f'timm model id ({len(timm_ids)})')
    towers = [_timm_tower(str(timm_id), int(size), source)
              for timm_id, size in zip(timm_ids, sizes)]
    if is_fused and (towers[0].kind, towers[1].kind) != ('dinov2', 'siglip'):
        raise CheckpointError(f'{source}: timm_model_ids {list(timm_ids)}: a fused backbone is '
                              'DINOv2 first, SigLIP second')
    return towers[0], (towers[1] if is_fused else None)


def config_from_json(data: dict, source: str = 'config.json') -> VLAConfig:
    if data.get('model_type') not in ('openvla', None):
        raise CheckpointError(f'{source}: model_type {data.get("model_type")!r} is not "openvla"')
    is_fused = _is_fused(data, source)
    allowed = FUSED_ARCH_SPECIFIERS if is_fused else SINGLE_ARCH_SPECIFIERS
    arch = data.get('arch_specifier', allowed[0])
    if arch not in allowed:
        raise CheckpointError(
            f'{source}: arch_specifier {arch!r} with use_fused_vision_backbone '
            f'{"true" if is_fused else "false"}: expected one of {list(allowed)} (the Hugging '
            f'Face projector is {"fc1-fc2-fc3" if is_fused else "fc1-fc2"} for this backbone)')
    resize = data.get('image_resize_strategy', 'resize-naive')
    if resize != 'resize-naive':
        raise CheckpointError(f'{source}: image_resize_strategy {resize!r} is not supported '
                              '(images are resized as OpenVLA does, "resize-naive")')
    try:
        featurizer, fused = _towers_from_json(data, is_fused, source)
        pad_multiple = int(data.get('pad_to_multiple_of', 64))
        pad_id = int(data.get('pad_token_id', 32000))
        text = {**LLAMA_DEFAULTS, **data.get('text_config', {})}
        vocab = int(text.get('vocab_size') or _round_up(pad_id + 1, pad_multiple))
        llm = LlamaConfig(
            hidden_size=int(text['hidden_size']), num_layers=int(text['num_hidden_layers']),
            num_heads=int(text['num_attention_heads']),
            num_kv_heads=int(text['num_key_value_heads'] or 0),
            head_dim=int(text.get('head_dim') or 0),
            intermediate_size=int(text['intermediate_size']), vocab_size=vocab,
            rms_norm_eps=float(text['rms_norm_eps']), rope_theta=float(text['rope_theta']),
            max_position_embeddings=int(text['max_position_embeddings']))
        return VLAConfig(featurizer=featurizer, fused_featurizer=fused, llm=llm,
                         n_action_bins=int(data.get('n_action_bins', 256)),
                         action_chunk=int(data.get('action_chunk', 1)),
                         pad_to_multiple_of=pad_multiple, pad_token_id=pad_id)
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f'{source}: malformed model configuration ({exc!r})') from exc
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f'{source}: {exc}') from exc


# ---- the model ------------------------------------------------------------------------------

def build_model(cfg: VLAConfig, dtype: torch.dtype = torch.float32, device='cpu',
                seed: int | None = None) -> OpenVLA:
    """A randomly initialised model (seeded) in ``dtype`` on ``device``."""
    if seed is not None:
        torch.manual_seed(seed)
    model = OpenVLA(cfg)
    init_random_(model)
    return model.to(device=device, dtype=dtype).eval()


def init_random_(model: OpenVLA) -> None:
    """Small random weights that keep activations well scaled at any depth (for tests)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith('scale_factor'):
                p.fill_(0.1)                       # LayerScale
            elif p.dim() == 1 and name.endswith('weight'):
                p.normal_(1.0, 0.05)               # norm gains
            elif p.dim() == 1 or name.endswith(('pos_embed', 'cls_token', 'reg_token')):
                p.normal_(0.0, 0.02)               # biases and learned tokens
            else:
                fan_in = p.shape[1] if p.dim() == 2 else p[0].numel()
                p.normal_(0.0, fan_in ** -0.5)     # Linear / Conv / Embedding


def check_vision_layout(cfg: VLAConfig, keys, source: str) -> None:
    """The weights' vision towers and projector must be the ones config.json describes: a
    fused flag over one tower's weights (or the reverse) is named as such, not left to
    surface as a missing or unexpected key."""
    keys = set(keys)
    flag = f'use_fused_vision_backbone is {"true" if cfg.is_fused else "false"}'
    has_tower = [any(k.startswith(prefix) for k in keys) for prefix in TOWER_PREFIXES]
    if not has_tower[0]:
        raise CheckpointError(f'{source}: no {TOWER_PREFIXES[0]}* key: the weights hold no '
                              'vision tower')
    if has_tower[1] != cfg.is_fused:
        raise CheckpointError(
            f'{source}: {flag} in config.json but the weights hold '
            + (f'one vision tower (no {TOWER_PREFIXES[1]}* key)' if cfg.is_fused
               else f'a second vision tower ({TOWER_PREFIXES[1]}* keys)'))
    has_fc3 = any(k.startswith('projector.fc3.') for k in keys)
    if has_fc3 != cfg.is_fused:
        raise CheckpointError(
            f'{source}: {flag} in config.json but the projector has '
            + ('two layers (no projector.fc3)' if cfg.is_fused
               else 'three layers (projector.fc3): that is the fused backbone\'s projector'))


def load_model(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device='cpu', read_config=None, model_class=None
               ) -> tuple[OpenVLA, VLAConfig, dict]:
    """Load an OpenVLA-layout checkpoint (fused or single vision tower) -> (model, config,
    config.json dict). A family in the same layout passes its own ``read_config(raw,
    source)`` and ``model_class`` (ECoT's: models/ecot/checkpoint.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    raw = _read_json(folder / 'config.json')
    cfg = (read_config or config_from_json)(raw, str(folder / 'config.json'))
    mapping = weight_files(folder)
    check_vision_layout(cfg, mapping, str(folder))
    with torch.device('meta'):
        model = (model_class or OpenVLA)(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = load_state_dict(folder, expected, set(unused_vision_keys(cfg)), dtype, device,
                            mapping)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval(), cfg, raw


def save_model(model: OpenVLA, cfg: VLAConfig, folder: str | os.PathLike, norm_stats: dict,
               max_shard_bytes: int | None = None, unused_seed: int = 0) -> None:
    """Write config.json + safetensors (sharded when ``max_shard_bytes`` is set).

    OpenVLA's unused vision keys are written too (seeded random values), so the folder has the
    exact key set of a real checkpoint.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = next(model.parameters()).dtype
    state = {k: v.detach().to('cpu').contiguous() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(unused_seed)
    for key, shape in unused_vision_keys(cfg).items():
        state[key] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
    dtype_name = str(dtype).replace('torch.', '')
    stale_files = list(folder.glob('model*.safetensors'))
    stale_files.append(folder / 'model.safetensors.index.json')
    for stale in stale_files:
        if stale.exists():
            stale.unlink()
    if max_shard_bytes is None:
        save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    else:
        shards: list[dict] = [{}]
        size = 0
        for key in sorted(state):
            nbytes = state[key].numel() * state[key].element_size()
            if shards[-1] and size + nbytes > max_shard_bytes:
                shards.append({})
                size = 0
            shards[-1][key] = state[key]
            size += nbytes
        weight_map = {}
        for i, shard in enumerate(shards):
            name = f'model-{i + 1:05d}-of-{len(shards):05d}.safetensors'
            save_file(shard, str(folder / name), metadata={'format': 'pt'})
            weight_map.update({k: name for k in shard})
        total = sum(v.numel() * v.element_size() for v in state.values())
        (folder / 'model.safetensors.index.json').write_text(json.dumps(
            {'metadata': {'total_size': total}, 'weight_map': weight_map}, indent=2))
    (folder / 'config.json').write_text(json.dumps(config_to_json(cfg, norm_stats, dtype_name),
                                                   indent=2))
    (folder / 'dataset_statistics.json').write_text(json.dumps(norm_stats, indent=2))
