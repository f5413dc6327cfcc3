"""Checkpoint I/O in OpenVLA's Hugging Face layout (docs/openvla.md, Checkpoint layout; S8).

A checkpoint folder holds ``config.json`` (model_type "openvla", ``text_config``, ``norm_stats``,
``n_action_bins``, ``pad_to_multiple_of``, ``image_sizes``), ``model.safetensors`` or shards
listed in ``model.safetensors.index.json``, ``dataset_statistics.json`` and tokenizer files.
Only safetensors are read; no code shipped with a checkpoint is ever executed. Every key is
either consumed by the model or listed in ``unused_vision_keys``; anything else is an error
naming the key and file.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..config import (DINOV2_MEAN, DINOV2_STD, SIGLIP_MEAN, SIGLIP_STD, LlamaConfig,
                      VisionTowerConfig, VLAConfig)
from .vision import unused_vision_keys
from .vla import OpenVLA


class CheckpointError(ValueError):
    """A checkpoint folder is missing, truncated or does not match the model."""


# The backbone OpenVLA-7B ships with; its tower dims are implied by the timm ids.
OPENVLA_TIMM_IDS = ('vit_large_patch14_reg4_dinov2.lvd142m', 'vit_so400m_patch14_siglip_224')
# transformers' LlamaConfig defaults, used for keys a minimal ``text_config`` leaves out
# (openvla.md §1.3: rms_norm_eps falls back to 1e-6).
LLAMA_DEFAULTS = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=None, rms_norm_eps=1e-6,
                      rope_theta=10000.0, max_position_embeddings=2048)
_DTYPES = {'F64': torch.float64, 'F32': torch.float32, 'F16': torch.float16,
           'BF16': torch.bfloat16}


def _round_up(x: int, multiple: int) -> int:
    return x if multiple <= 0 else (x + multiple - 1) // multiple * multiple


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise CheckpointError(f'missing file {path}')
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f'{path}: not valid JSON ({exc})') from exc


# ---- config.json <-> VLAConfig --------------------------------------------------------------

def _tower_to_dict(t: VisionTowerConfig) -> dict:
    return dict(kind=t.kind, image_size=t.image_size, patch_size=t.patch_size,
                embed_dim=t.embed_dim, depth=t.depth, num_heads=t.num_heads, mlp_dim=t.mlp_dim,
                num_register_tokens=t.num_register_tokens, norm_eps=t.norm_eps,
                mean=list(t.mean), std=list(t.std))


def config_to_json(cfg: VLAConfig, norm_stats: dict, torch_dtype: str = 'float32') -> dict:
    llm = cfg.llm
    is_openvla_backbone = (cfg.featurizer == VisionTowerConfig(
        'dinov2', 224, 14, 1024, 24, 16, 4096, num_register_tokens=4, mean=DINOV2_MEAN,
        std=DINOV2_STD) and cfg.fused_featurizer == VisionTowerConfig(
        'siglip', 224, 14, 1152, 27, 16, 4304, mean=SIGLIP_MEAN, std=SIGLIP_STD))
    out = {
        'architectures': ['OpenVLAForActionPrediction'],
        'model_type': 'openvla',
        'vision_backbone_id': 'dinosiglip-vit-so-224px' if is_openvla_backbone
        else 'vla-spec-dinosiglip',
        'llm_backbone_id': 'llama2-7b-pure',
        'arch_specifier': 'no-align+fused-gelu-mlp',
        'use_fused_vision_backbone': True,
        'image_resize_strategy': 'resize-naive',
        'image_sizes': [cfg.image_size, cfg.image_size],
        'timm_model_ids': list(OPENVLA_TIMM_IDS),
        'timm_override_act_layers': [None, None],
        'llm_max_length': llm.max_position_embeddings,
        'pad_token_id': cfg.pad_token_id,
        'pad_to_multiple_of': cfg.pad_to_multiple_of,
        'n_action_bins': cfg.n_action_bins,
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
    if not is_openvla_backbone:
        # Non-standard towers (tiny / embedded presets) record their dims explicitly; the real
        # OpenVLA backbone is implied by its timm ids.
        out['vla_spec_vision'] = {'featurizer': _tower_to_dict(cfg.featurizer),
                                  'fused_featurizer': _tower_to_dict(cfg.fused_featurizer)}
    return out


def config_from_json(data: dict, source: str = 'config.json') -> VLAConfig:
    if data.get('model_type') not in ('openvla', None):
        raise CheckpointError(f'{source}: model_type {data.get("model_type")!r} is not "openvla"')
    if not data.get('use_fused_vision_backbone', True):
        raise CheckpointError(f'{source}: only the fused DINOv2+SigLIP backbone is supported')
    arch = data.get('arch_specifier', 'no-align+fused-gelu-mlp')
    if arch != 'no-align+fused-gelu-mlp':
        raise CheckpointError(f'{source}: arch_specifier {arch!r} is not supported')
    try:
        if 'vla_spec_vision' in data:
            towers = data['vla_spec_vision']
            featurizer = VisionTowerConfig(**towers['featurizer'])
            fused = VisionTowerConfig(**towers['fused_featurizer'])
        elif tuple(data.get('timm_model_ids', OPENVLA_TIMM_IDS)) == OPENVLA_TIMM_IDS:
            size = int(data.get('image_sizes', [224])[0])
            if size != 224:
                raise CheckpointError(f'{source}: image_sizes {size} != 224 for OpenVLA towers')
            featurizer = VisionTowerConfig('dinov2', 224, 14, 1024, 24, 16, 4096,
                                           num_register_tokens=4, mean=DINOV2_MEAN,
                                           std=DINOV2_STD)
            fused = VisionTowerConfig('siglip', 224, 14, 1152, 27, 16, 4304,
                                      mean=SIGLIP_MEAN, std=SIGLIP_STD)
        else:
            raise CheckpointError(f'{source}: unsupported timm_model_ids '
                                  f'{data.get("timm_model_ids")}')
        pad_multiple = int(data.get('pad_to_multiple_of', 64))
        pad_id = int(data.get('pad_token_id', 32000))
        text = {**LLAMA_DEFAULTS, **data.get('text_config', {})}
        vocab = int(text.get('vocab_size') or _round_up(pad_id + 1, pad_multiple))
        llm = LlamaConfig(
            hidden_size=int(text['hidden_size']), num_layers=int(text['num_hidden_layers']),
            num_heads=int(text['num_attention_heads']),
            num_kv_heads=int(text['num_key_value_heads'] or 0),
            intermediate_size=int(text['intermediate_size']), vocab_size=vocab,
            rms_norm_eps=float(text['rms_norm_eps']), rope_theta=float(text['rope_theta']),
            max_position_embeddings=int(text['max_position_embeddings']))
        return VLAConfig(featurizer=featurizer, fused_featurizer=fused, llm=llm,
                         n_action_bins=int(data.get('n_action_bins', 256)),
                         pad_to_multiple_of=pad_multiple, pad_token_id=pad_id)
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f'{source}: malformed model configuration ({exc!r})') from exc
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f'{source}: {exc}') from exc


# ---- safetensors ----------------------------------------------------------------------------

def _check_safetensors_file(path: Path) -> dict:
    """Parse the header and verify the file holds every byte it declares (truncation check)."""
    if not path.is_file():
        raise CheckpointError(f'missing weight file {path}')
    size = path.stat().st_size
    with open(path, 'rb') as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f'{path}: truncated (no safetensors header)')
        (header_len,) = struct.unpack('<Q', head)
        if header_len > size - 8:
            raise CheckpointError(f'{path}: truncated (header of {header_len} bytes, '
                                  f'file has {size})')
        try:
            header = json.loads(f.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise CheckpointError(f'{path}: corrupt safetensors header ({exc})') from exc
    header.pop('__metadata__', None)
    data_end = max((v['data_offsets'][1] for v in header.values()), default=0)
    if 8 + header_len + data_end > size:
        raise CheckpointError(f'{path}: truncated: tensors need {8 + header_len + data_end} '
                              f'bytes, file has {size}')
    return header


def weight_files(folder: Path) -> dict[str, Path]:
    """key -> file, from the shard index if present, else from model.safetensors."""
    index = folder / 'model.safetensors.index.json'
    single = folder / 'model.safetensors'
    if index.is_file():
        weight_map = _read_json(index).get('weight_map')
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f'{index}: no weight_map')
        mapping = {k: folder / v for k, v in weight_map.items()}
        for path in sorted(set(mapping.values())):
            header = _check_safetensors_file(path)
            listed = {k for k, p in mapping.items() if p == path}
            absent = sorted(listed - set(header))
            if absent:
                raise CheckpointError(f'{path}: missing key {absent[0]} listed in {index.name}'
                                      f' ({len(absent)} missing)')
        return mapping
    if single.is_file():
        return {k: single for k in _check_safetensors_file(single)}
    if any(folder.glob('*.bin')) or any(folder.glob('*.pt')):
        raise CheckpointError(f'{folder}: only pickle weights (.bin/.pt) found; only '
                              'safetensors are loaded (no code from checkpoints is executed)')
    raise CheckpointError(f'{folder}: no model.safetensors or model.safetensors.index.json')


def load_state_dict(folder: Path, expected: dict[str, tuple], allowed_unused: set[str],
                    dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
    mapping = weight_files(folder)
    missing = sorted(set(expected) - set(mapping))
    if missing:
        raise CheckpointError(f'{folder}: missing key {missing[0]} ({len(missing)} missing)')
    unexpected = sorted(set(mapping) - set(expected) - allowed_unused)
    if unexpected:
        raise CheckpointError(f'{mapping[unexpected[0]]}: unexpected key {unexpected[0]} '
                              f'({len(unexpected)} unexpected)')
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for key in expected:
        by_file.setdefault(mapping[key], []).append(key)
    for path, keys in by_file.items():
        with safe_open(str(path), framework='pt', device='cpu') as f:
            for key in keys:
                shape = tuple(f.get_slice(key).get_shape())
                if shape != tuple(expected[key]):
                    raise CheckpointError(f'{path}: key {key} has shape {shape}, model expects '
                                          f'{tuple(expected[key])}')
                state[key] = f.get_tensor(key).to(device=device, dtype=dtype)
    return state


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


def load_model(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device='cpu') -> tuple[OpenVLA, VLAConfig, dict]:
    """Load an OpenVLA-layout checkpoint -> (model, config, config.json dict)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    raw = _read_json(folder / 'config.json')
    cfg = config_from_json(raw, str(folder / 'config.json'))
    with torch.device('meta'):
        model = OpenVLA(cfg)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    state = load_state_dict(folder, expected, set(unused_vision_keys(cfg)), dtype, device)
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
