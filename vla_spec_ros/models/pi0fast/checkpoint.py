"""pi0-FAST checkpoints in LeRobot's layout (docs/pi0fast.md, Checkpoint layout; S8).

A folder holds ``config.json`` (LeRobot's ``PI0FastConfig``: ``type`` "pi0_fast", the
``input_features`` (one VISUAL entry per image slot, in slot order; ``observation.state``),
``output_features`` (``action``), ``chunk_size``, ``max_state_dim``, ``max_action_tokens``,
``fast_skip_tokens``, ``paligemma_variant``), ``model.safetensors`` whose keys are
``model.paligemma_with_expert.paligemma.`` + transformers' ``PaliGemmaForConditionalGeneration``
names, the text ``tokenizer.json``, the FAST tokenizer in ``fast_tokenizer/`` and the dataset
statistics (``dataset_statistics.json``, the engine's ``norm_stats`` format). Dimensions come
from ``paligemma_variant`` (``gemma_2b``: PaliGemma-3B's Gemma-2B and SigLIP So400m/14 at
224 px) unless ``paligemma_config.json`` (a transformers ``PaliGemmaConfig``) states them, as a
random-weight checkpoint's does.

Key spellings of several transformers versions load: ``model.vision_tower.vision_model.*``
(before 5.x) or ``model.vision_tower.*``, ``model.language_model.*`` or
``language_model.model.*``. The SigLIP pooling head (``vision_tower.head.*``) is unused; the
LM head is the embedding table (``lm_head.weight``, when present, is unused). Only safetensors
are read; no code from the checkpoint runs.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import save_file

from ...config import LlamaConfig, Pi0FastConfig, VisionTowerConfig, gemma_2b, siglip_so400m
from ..weights import CheckpointError, _read_json, load_state_dict, weight_files
from .model import Pi0Fast

LEROBOT_PREFIX = 'model.paligemma_with_expert.paligemma.'
FAMILY_TYPES = ('pi0_fast', 'pi0fast')      # LeRobot 0.6's type, and its older name
PALIGEMMA_CONFIG_FILE = 'paligemma_config.json'
FAST_TOKENIZER_FOLDER = 'fast_tokenizer'
STATE_KEY = 'observation.state'


def is_pi0fast_config(raw: dict) -> bool:
    return isinstance(raw, dict) and raw.get('type') in FAMILY_TYPES


# ---- keys -------------------------------------------------------------------------------

def hf_name(key: str) -> str:
    """Our parameter name -> transformers' PaliGemma name (5.x spelling)."""
    if key.startswith('language_model.model.'):
        return 'model.language_model.' + key[len('language_model.model.'):]
    if key == 'language_model.lm_head.weight':
        return 'lm_head.weight'
    return 'model.' + key


def canonical_name(checkpoint_key: str) -> str | None:
    """A checkpoint key -> transformers' 5.x PaliGemma name, or None when it lies outside
    the PaliGemma prefix."""
    if not checkpoint_key.startswith(LEROBOT_PREFIX):
        return None
    key = checkpoint_key[len(LEROBOT_PREFIX):]
    for old, new in (('model.vision_tower.vision_model.', 'model.vision_tower.'),
                     ('vision_tower.vision_model.', 'model.vision_tower.'),
                     ('language_model.model.', 'model.language_model.'),
                     ('language_model.lm_head.', 'lm_head.'),
                     ('multi_modal_projector.', 'model.multi_modal_projector.')):
        if key.startswith(old):
            return new + key[len(old):]
    return key


def _is_unused(name: str) -> bool:
    return name.startswith('model.vision_tower.head.') or name == 'lm_head.weight'


# ---- config -----------------------------------------------------------------------------

def _visual_keys(raw: dict) -> list[str]:
    features = raw.get('input_features') or {}
    return [k for k, v in features.items() if isinstance(v, dict) and v.get('type') == 'VISUAL']


def _configs_from_paligemma(data: dict, source: str) -> tuple[VisionTowerConfig, LlamaConfig]:
    text, vision = data.get('text_config') or {}, data.get('vision_config') or {}
    rope = text.get('rope_parameters') or {}
    try:
        llm = LlamaConfig(
            hidden_size=int(text['hidden_size']), num_layers=int(text['num_hidden_layers']),
            num_heads=int(text['num_attention_heads']),
            num_kv_heads=int(text.get('num_key_value_heads') or 0),
            head_dim=int(text.get('head_dim') or 0),
            intermediate_size=int(text['intermediate_size']),
            vocab_size=int(text['vocab_size']), rms_norm_eps=float(text.get('rms_norm_eps', 1e-6)),
            rope_theta=float(text.get('rope_theta', rope.get('rope_theta', 10000.0))),
            max_position_embeddings=int(text.get('max_position_embeddings', 8192)),
            norm_unit_offset=True, hidden_act='gelu_tanh', embed_scale=True,
            tie_word_embeddings=True)
        tower = VisionTowerConfig(
            'siglip', int(vision['image_size']), int(vision['patch_size']),
            int(vision['hidden_size']), int(vision['num_hidden_layers']),
            int(vision['num_attention_heads']), int(vision['intermediate_size']),
            norm_eps=float(vision.get('layer_norm_eps', 1e-6)), mean=(0.5,) * 3, std=(0.5,) * 3)
    except (KeyError, TypeError) as exc:
        raise CheckpointError(f'{source}: malformed PaliGemma configuration ({exc!r})') from exc
    except ValueError as exc:
        raise CheckpointError(f'{source}: {exc}') from exc
    return tower, llm


def config_from_folder(folder: Path, raw: dict) -> Pi0FastConfig:
    source = str(folder / 'config.json')
    sidecar = folder / PALIGEMMA_CONFIG_FILE
    if sidecar.is_file():
        tower, llm = _configs_from_paligemma(_read_json(sidecar), str(sidecar))
    elif raw.get('paligemma_variant', 'gemma_2b') == 'gemma_2b':
        tower, llm = siglip_so400m(224), gemma_2b()
    else:
        raise CheckpointError(f'{source}: paligemma_variant {raw.get("paligemma_variant")!r} '
                              f'is not supported without {PALIGEMMA_CONFIG_FILE}')
    visual = _visual_keys(raw)
    if not visual:
        raise CheckpointError(f'{source}: no VISUAL entry in input_features')
    for key in visual:
        shape = raw['input_features'][key].get('shape')
        if shape and int(shape[-1]) != tower.image_size:
            raise CheckpointError(f'{source}: {key} has shape {shape}; the SigLIP tower sees '
                                  f'{tower.image_size} px')
    try:
        max_state = int(raw.get('max_state_dim', 32))
        state = (raw.get('input_features') or {}).get(STATE_KEY) or {}
        action = (raw.get('output_features') or {}).get('action') or {}
        return Pi0FastConfig(
            vision=tower, llm=llm, num_image_slots=len(visual),
            state_dim=int((state.get('shape') or [max_state])[-1]), max_state_dim=max_state,
            chunk_size=int(raw.get('chunk_size', 10)),
            action_dim=int((action.get('shape') or [7])[-1]),
            max_action_tokens=int(raw.get('max_action_tokens', 256)),
            fast_skip_tokens=int(raw.get('fast_skip_tokens', 128)),
            lowercase_instruction=bool(raw.get('lowercase_instruction', True)),
            default_draft=str(raw.get('default_draft', 'previous_action')))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f'{source}: {exc}') from exc


def config_to_json(cfg: Pi0FastConfig) -> dict:
    """LeRobot's config.json fields this package reads (plus ``lowercase_instruction`` and
    ``default_draft``, the spec modes' draft when none is configured)."""
    size = cfg.image_size
    slots = ['observation.images.base_0_rgb', 'observation.images.left_wrist_0_rgb',
             'observation.images.right_wrist_0_rgb']
    slots += [f'observation.images.camera_{i}' for i in range(3, cfg.num_image_slots)]
    features = {name: {'type': 'VISUAL', 'shape': [3, size, size]}
                for name in slots[:cfg.num_image_slots]}
    features[STATE_KEY] = {'type': 'STATE', 'shape': [cfg.state_dim]}
    return {'type': 'pi0_fast', 'input_features': features,
            'output_features': {'action': {'type': 'ACTION', 'shape': [cfg.action_dim]}},
            'chunk_size': cfg.chunk_size, 'n_action_steps': cfg.chunk_size,
            'max_state_dim': cfg.max_state_dim, 'max_action_dim': cfg.max_state_dim,
            'max_action_tokens': cfg.max_action_tokens,
            'fast_skip_tokens': cfg.fast_skip_tokens, 'paligemma_variant': 'gemma_2b',
            'text_tokenizer_name': 'tokenizer.json',
            'action_tokenizer_name': FAST_TOKENIZER_FOLDER,
            'lowercase_instruction': cfg.lowercase_instruction,
            'default_draft': cfg.default_draft}


def paligemma_config_json(cfg: Pi0FastConfig) -> dict:
    """The transformers ``PaliGemmaConfig`` of these dimensions (the sidecar file)."""
    llm, tower = cfg.llm, cfg.vision
    return {'model_type': 'paligemma', 'image_token_id': llm.vocab_size,
            'projection_dim': llm.hidden_size, 'hidden_size': llm.hidden_size,
            'vision_config': {'model_type': 'siglip_vision_model',
                              'hidden_size': tower.embed_dim,
                              'intermediate_size': tower.mlp_dim,
                              'num_hidden_layers': tower.depth,
                              'num_attention_heads': tower.num_heads,
                              'image_size': tower.image_size, 'patch_size': tower.patch_size,
                              'layer_norm_eps': tower.norm_eps, 'vision_use_head': False,
                              'projection_dim': llm.hidden_size,
                              'hidden_act': 'gelu_pytorch_tanh'},
            'text_config': {'model_type': 'gemma', 'hidden_size': llm.hidden_size,
                            'intermediate_size': llm.intermediate_size,
                            'num_hidden_layers': llm.num_layers,
                            'num_attention_heads': llm.num_heads,
                            'num_key_value_heads': llm.num_kv_heads, 'head_dim': llm.head_dim,
                            'vocab_size': llm.vocab_size, 'rms_norm_eps': llm.rms_norm_eps,
                            'rope_theta': llm.rope_theta,
                            'max_position_embeddings': llm.max_position_embeddings,
                            'hidden_activation': 'gelu_pytorch_tanh'}}


# ---- weights ----------------------------------------------------------------------------

def load_model(folder: str | os.PathLike, dtype: torch.dtype = torch.float32,
               device='cpu') -> tuple[Pi0Fast, Pi0FastConfig, dict]:
    """A LeRobot-layout pi0-FAST folder -> (model without its codec, config, config.json)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    raw = _read_json(folder / 'config.json')
    if not is_pi0fast_config(raw):
        raise CheckpointError(f'{folder / "config.json"}: type {raw.get("type")!r} is not '
                              f'one of {FAMILY_TYPES}')
    cfg = config_from_folder(folder, raw)
    files = weight_files(folder)
    by_name: dict[str, str] = {}
    for key in files:
        name = canonical_name(key)
        if name is None:
            raise CheckpointError(f'{files[key]}: unexpected key {key} (outside '
                                  f'{LEROBOT_PREFIX}*)')
        by_name[name] = key
    with torch.device('meta'):
        model = Pi0Fast(cfg)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()
            if k != 'language_model.lm_head.weight'}           # tied: the embedding table
    expected = {by_name.get(hf_name(k), LEROBOT_PREFIX + hf_name(k)): shape
                for k, shape in ours.items()}
    unused = {key for name, key in by_name.items() if _is_unused(name)}
    state = load_state_dict(folder, expected, unused, dtype, device,
                            {k: v for k, v in files.items()})
    by_checkpoint = {by_name.get(hf_name(k), LEROBOT_PREFIX + hf_name(k)): k for k in ours}
    model.load_state_dict({by_checkpoint[k]: v for k, v in state.items()}, strict=False,
                          assign=True)
    model.language_model.tie_weights()
    return model.eval(), cfg, raw


def save_model(model: Pi0Fast, folder: str | os.PathLike) -> None:
    """model.safetensors (LeRobot's keys), config.json and paligemma_config.json."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {LEROBOT_PREFIX + hf_name(k): v.detach().to('cpu').contiguous()
             for k, v in model.state_dict().items() if k != 'language_model.lm_head.weight'}
    save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    (folder / 'config.json').write_text(json.dumps(config_to_json(model.cfg), indent=2))
    (folder / PALIGEMMA_CONFIG_FILE).write_text(json.dumps(paligemma_config_json(model.cfg),
                                                           indent=2))
