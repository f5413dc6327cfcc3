"""Model families by checkpoint: which family a folder holds, loading it, and random-weight
checkpoints of a preset. ``policy.VLAPolicy.from_pretrained`` and ``vla-spec make-checkpoint``
go through here; the engine never names a family.

A folder is pi0-FAST when its config.json has LeRobot's ``type`` "pi0_fast" (or "pi0fast"),
else OpenVLA (``architectures`` ``OpenVLAForActionPrediction``, ``model_type`` "openvla", or
the layout this package has always read)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..config import Pi0FastConfig, preset
from .weights import CheckpointError, _read_json

FAMILIES = ('openvla', 'pi0fast')


@dataclass
class LoadedModel:
    """What a runner needs: the model, its config, config.json, its prompt builder and its
    action codec; ``norm_stats``: the dataset statistics when the family keeps them outside
    config.json (pi0-FAST: LeRobot's processor files), else None."""

    model: Any
    cfg: Any
    raw: dict
    tokenizer: Any
    codec: Any
    family: str
    norm_stats: dict | None = None


def family_of(raw: dict) -> str:
    if raw.get('type') in ('pi0_fast', 'pi0fast'):
        return 'pi0fast'
    return 'openvla'


def family_of_preset(name: str) -> str:
    return 'pi0fast' if isinstance(preset(name), Pi0FastConfig) else 'openvla'


def load(folder, dtype: torch.dtype = torch.float32, device='cpu',
         max_instruction_tokens: int = 128) -> LoadedModel:
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    family = family_of(_read_json(folder / 'config.json'))
    if family == 'pi0fast':
        from .pi0fast.family import load as load_pi0fast
        model, cfg, raw, prompt, norm_stats = load_pi0fast(folder, dtype, device,
                                                           max_instruction_tokens)
        return LoadedModel(model, cfg, raw, prompt, model.action_codec(), family, norm_stats)
    from ..prompt import PromptTokenizer
    from .openvla.checkpoint import load_model
    model, cfg, raw = load_model(folder, dtype, device)
    tokenizer = PromptTokenizer.from_folder(folder, max_instruction_tokens)
    return LoadedModel(model, cfg, raw, tokenizer, model.action_codec(), family)


def make_checkpoint(preset_name: str, out, seed: int = 0, dtype: str = 'float32',
                    max_shard_bytes: int | None = None, *, num_image_slots: int | None = None,
                    image_size: int | None = None, state_dim: int | None = None,
                    decodable_chunks: bool = False) -> Path:
    """A random-weight checkpoint of ``preset_name`` in its family's layout. pi0-FAST presets
    only: ``num_image_slots``, ``image_size`` and ``state_dim`` replace the preset's (None
    keeps it; pi0fast/family.configure); ``decodable_chunks`` makes greedy decoding write a
    valid FAST frame (a test aid, pi0fast/decodable.py)."""
    fast_only = {'num_image_slots': num_image_slots, 'image_size': image_size,
                 'state_dim': state_dim, 'decodable_chunks': decodable_chunks or None}
    if family_of_preset(preset_name) == 'pi0fast':
        if max_shard_bytes is not None:
            raise ValueError('max_shard_bytes: pi0-FAST checkpoints are written unsharded')
        from .pi0fast.family import configure, make_random
        cfg = configure(preset_name, num_image_slots=num_image_slots, image_size=image_size,
                        state_dim=state_dim)
        return make_random(cfg, out, seed=seed, dtype=dtype,
                           decodable_chunks=decodable_chunks)
    given = [name for name, value in fast_only.items() if value is not None]
    if given:
        raise ValueError(f'{given[0]}: only pi0-FAST presets take it; {preset_name!r} is an '
                         'OpenVLA preset (one image, no state, its own action bins)')
    from .openvla.random_checkpoint import make_checkpoint as make_openvla
    return make_openvla(preset_name, out, seed=seed, dtype=dtype,
                        max_shard_bytes=max_shard_bytes)
