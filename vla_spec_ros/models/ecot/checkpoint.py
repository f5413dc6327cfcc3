"""ECoT checkpoints: OpenVLA's Hugging Face layout, read and written with OpenVLA's own code
(models/openvla/checkpoint.py), plus what ECoT's config.json says differently.

An ECoT folder is OpenVLA's: ``model_type`` "openvla", the same weight keys and action bins,
``norm_stats``. What it adds: ``llm_backbone_id`` "vicuna-v15-7b" (Prismatic's Vicuna v1.5
backbone, whose chat prompt ECoT uses: prompt.py), ``image_resize_strategy`` "letterbox"
(letterbox.py), and, written by this package only, ``vla_spec_max_reasoning_tokens`` (the
checkpoint's text budget; absent: 1024, ECoT's own). Loading builds the towers and decoder as
OpenVLA does, into ``EcotVLA``.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from ..family import LoadedModel
from ..openvla.checkpoint import config_from_json, init_random_, save_model
from ..openvla.checkpoint import load_model as load_openvla_layout
from ..openvla.prompt import (PromptTokenizer, build_tokenizer, check_tokenizer_fits,
                              save_tokenizer)
from ..openvla.random_checkpoint import DTYPES, synthetic_norm_stats
from ..weights import CheckpointError
from .config import DEFAULT_MAX_REASONING_TOKENS, RESIZE_STRATEGIES, EcotConfig
from .model import EcotVLA
from .prompt import EcotPrompt
from .reasoning_text import ACTION_TAG, TAGS

NAME = 'ecot'
VICUNA_BACKBONE = 'vicuna-v15-7b'
BUDGET_KEY = 'vla_spec_max_reasoning_tokens'


def config_from_raw(raw: dict, source: str = 'config.json') -> EcotConfig:
    """config.json -> EcotConfig (OpenVLA's reading, then ECoT's fields)."""
    resize = raw.get('image_resize_strategy', 'resize-naive')
    if resize not in RESIZE_STRATEGIES:
        raise CheckpointError(f'{source}: image_resize_strategy {resize!r} is not one of '
                              f'{list(RESIZE_STRATEGIES)}')
    cfg = config_from_json({**raw, 'image_resize_strategy': 'resize-naive'}, source)
    try:
        return EcotConfig.from_vla(cfg, image_resize_strategy=resize, max_reasoning_tokens=int(
            raw.get(BUDGET_KEY, DEFAULT_MAX_REASONING_TOKENS)))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f'{source}: {exc}') from exc


def load_model(folder: str | os.PathLike, dtype: torch.dtype, device,
               max_instruction_tokens: int = 128) -> LoadedModel:
    """OpenVLA's loading with ECoT's config reading and model class, then its prompt."""
    model, cfg, raw = load_openvla_layout(folder, dtype, device, read_config=config_from_raw,
                                          model_class=EcotVLA)
    prompt = EcotPrompt.from_folder(Path(folder), max_instruction_tokens)
    check_tokenizer_fits(prompt.base, cfg)
    model.use_prompt(prompt)
    return LoadedModel(model, cfg, raw, model.prompt, model.action_codec(), NAME)


# Text the test tokenizer learns besides instructions, so that ECoT's tags and reasoning words
# are a few tokens each, as in Llama's vocabulary.
SAMPLE_REASONINGS = tuple(
    f'{TAGS[0]} {task}. {TAGS[1]} Reach for the {obj}. Grasp the {obj}. Move the {obj} to the '
    f'{goal}. {TAGS[2]} {obj} [12, 40, 88, 120], {goal} [140, 60, 230, 200] {TAGS[3]} The '
    f'{obj} must be held first. {TAGS[4]} Reach for the {obj}. {TAGS[5]} The gripper is '
    f'{side} of the {obj}. {TAGS[6]} move {side} down {TAGS[7]} [101, 57, 99, 60] {ACTION_TAG}'
    for task, obj, goal, side in (
        ('put the cup on the plate', 'cup', 'plate', 'left'),
        ('place the watermelon on the towel', 'watermelon', 'towel', 'right'),
        ('open the drawer', 'drawer handle', 'drawer', 'forward'),
        ('stack the blue block on the red block', 'blue block', 'red block', 'backward')))


def make_checkpoint(preset_name: str | EcotConfig, out, seed: int = 0, dtype: str = 'float32',
                    scripted_reasoning: bool = False) -> Path:
    """A random-weight checkpoint in ECoT's layout: OpenVLA's files, ECoT's config keys, a
    small real tokenizer that knows ECoT's tags. ``scripted_reasoning``: a test aid whose
    greedy decoding writes a reasoning and an action (scripted.py)."""
    from ..registry import preset
    cfg = preset(preset_name) if isinstance(preset_name, str) else preset_name
    if not isinstance(cfg, EcotConfig):
        raise ValueError(f'preset: {preset_name!r} is not an ECoT preset')
    if dtype not in DTYPES:
        raise ValueError(f'dtype: {dtype!r} not in {sorted(DTYPES)}')
    out = Path(out)
    tokenizer = build_tokenizer(cfg.pad_token_id, seed,
                                extra_text=list(SAMPLE_REASONINGS) * 50)
    torch.manual_seed(seed)
    model = EcotVLA(cfg)
    init_random_(model)
    model.use_prompt(EcotPrompt(PromptTokenizer(tokenizer)))
    if scripted_reasoning:
        from .scripted import script_reasoning_
        script_reasoning_(model, model.prompt, SAMPLE_REASONINGS[seed % len(SAMPLE_REASONINGS)])
    model = model.to(dtype=DTYPES[dtype]).eval()
    save_checkpoint(model, cfg, out, synthetic_norm_stats(cfg.action_dim, seed), tokenizer,
                    seed, {'vla_spec_scripted_reasoning': True} if scripted_reasoning else {})
    return out


def save_checkpoint(model, cfg: EcotConfig, out, norm_stats: dict, tokenizer, seed: int,
                    extra: dict | None = None) -> None:
    """OpenVLA's files (save_model), ECoT's config.json keys (module docstring) plus
    ``extra``, and the tokenizer."""
    out = Path(out)
    save_model(model, cfg, out, norm_stats, unused_seed=seed)
    path = out / 'config.json'
    raw = json.loads(path.read_text())
    raw.update({'llm_backbone_id': VICUNA_BACKBONE, 'hf_llm_id': 'lmsys/vicuna-7b-v1.5',
                'image_resize_strategy': cfg.image_resize_strategy,
                BUDGET_KEY: cfg.max_reasoning_tokens, **(extra or {})})
    path.write_text(json.dumps(raw, indent=2))
    save_tokenizer(tokenizer, out)


__all__ = ['BUDGET_KEY', 'NAME', 'VICUNA_BACKBONE', 'config_from_raw', 'load_model',
           'make_checkpoint', 'save_checkpoint']
