"""pi0-FAST checkpoints in LeRobot 0.6's layout (docs/pi0fast.md, Checkpoint layout; S8).

A folder holds what LeRobot's ``PI0FastPolicy.save_pretrained`` and its processors'
``save_pretrained`` write:

- ``config.json``: LeRobot's ``PI0FastConfig`` (``type`` "pi0_fast"; only fields its strict
  parser accepts): ``input_features`` (one VISUAL entry per image slot, in slot order;
  ``observation.state``), ``output_features`` (``action``), ``chunk_size``,
  ``image_resolution``, ``max_decoding_steps``, ``fast_skip_tokens``, ``paligemma_variant``,
  ``text_tokenizer_name`` / ``action_tokenizer_name``, ``normalization_mapping``, ...;
- ``model.safetensors``: ``model.paligemma_with_expert.paligemma.`` + transformers 5.x
  ``PaliGemmaForConditionalGeneration`` names (``model.vision_tower.vision_model.*``,
  ``model.multi_modal_projector.linear.*``, ``model.language_model.*``, ``lm_head.weight``);
- the processors and the dataset statistics (statistics.py).

The tokenizers: ``text_tokenizer_name`` and ``action_tokenizer_name`` name folders (LeRobot loads
them with ``AutoTokenizer`` / ``AutoProcessor``); a relative name is read relative to the
checkpoint folder here (LeRobot resolves it against its working directory). A random-weight
checkpoint writes ``paligemma_tokenizer/`` (tokenizer.json + tokenizer_config.json) and
``fast_tokenizer/``. Hub ids are not fetched: a checkpoint naming one needs the folder instead.

This package's additions, which LeRobot does not read: ``paligemma_config.json`` (a transformers
``PaliGemmaConfig``: dimensions other than ``paligemma_variant``'s, as a random-weight
checkpoint's) and ``vla_spec_pi0fast.json`` (``style``: "lerobot" or "openpi", style.py; absent:
"lerobot").

Weight keys of transformers before 4.52 (``vision_tower.vision_model.*``,
``multi_modal_projector.*``, ``language_model.model.*``, ``language_model.lm_head.*``) and of
transformers 5.24 (``model.vision_tower.*`` without ``vision_model.``) load too.
The LM head: LeRobot's is a parameter of its own. A file's ``lm_head.weight`` is the head; when
it equals the embedding table the two are tied here (one tensor), otherwise both are kept, as
LeRobot keeps them. A file without ``embed_tokens`` takes the head as the table (LeRobot's
``_fix_pytorch_state_dict_keys`` copies it there); a file without ``lm_head.weight`` ties the
head to the table (LeRobot would leave its head random). Only safetensors are read; no code
from the checkpoint runs.
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...config import LlamaConfig, VisionTowerConfig, siglip_so400m
from ..weights import CheckpointError, _read_json, load_state_dict, weight_files
from .config import LEROBOT_TYPES, Pi0FastConfig, gemma_2b
from .model import Pi0Fast
from .statistics import DEFAULT_MAPPING
from .style import DEFAULT_STYLE, STYLES

LEROBOT_PREFIX = 'model.paligemma_with_expert.paligemma.'
FAMILY_TYPES = LEROBOT_TYPES      # LeRobot 0.6's type, and its older name
PALIGEMMA_CONFIG_FILE = 'paligemma_config.json'
EXTRAS_FILE = 'vla_spec_pi0fast.json'
TEXT_TOKENIZER_FOLDER = 'paligemma_tokenizer'
FAST_TOKENIZER_FOLDER = 'fast_tokenizer'
STATE_KEY = 'observation.state'
LM_HEAD = 'lm_head.weight'
EMBED = 'model.language_model.embed_tokens.weight'
OUR_LM_HEAD = 'language_model.lm_head.weight'
OUR_EMBED = 'language_model.model.embed_tokens.weight'
VISION = 'model.vision_tower.'
IMAGE_SLOTS = ('observation.images.base_0_rgb', 'observation.images.left_wrist_0_rgb',
               'observation.images.right_wrist_0_rgb')


def is_pi0fast_config(raw: dict) -> bool:
    return isinstance(raw, dict) and raw.get('type') in FAMILY_TYPES


# ---- keys -------------------------------------------------------------------------------

def hf_name(key: str) -> str:
    """Our parameter name -> the name in the PaliGemma of transformers 5.24 (this project's
    environment; the SigLIP tower without ``vision_model.``), for an in-memory copy."""
    if key.startswith('language_model.model.'):
        return 'model.language_model.' + key[len('language_model.model.'):]
    if key == OUR_LM_HEAD:
        return LM_HEAD
    return 'model.' + key


def lerobot_name(key: str) -> str:
    """Our parameter name -> LeRobot 0.6.1's name after its prefix (transformers 5.5's
    PaliGemma: ``model.vision_tower.vision_model.*``)."""
    name = hf_name(key)
    if name.startswith(VISION):
        return VISION + 'vision_model.' + name[len(VISION):]
    return name


def canonical_name(checkpoint_key: str) -> str | None:
    """A checkpoint key -> LeRobot 0.6.1's spelling (``lerobot_name``), or None when it lies
    outside the PaliGemma prefix. Translated: transformers before 4.52
    (``vision_tower.vision_model.*``, ``multi_modal_projector.*``, ``language_model.model.*``,
    ``language_model.lm_head.*``) and transformers 5.24 (``model.vision_tower.*`` without
    ``vision_model.``); any other name is returned as it is (and is then an unexpected
    key)."""
    if not checkpoint_key.startswith(LEROBOT_PREFIX):
        return None
    key = checkpoint_key[len(LEROBOT_PREFIX):]
    if key.startswith(VISION) and not key.startswith(VISION + 'vision_model.'):
        return VISION + 'vision_model.' + key[len(VISION):]
    for old, new in (('vision_tower.vision_model.', VISION + 'vision_model.'),
                     ('language_model.model.', 'model.language_model.'),
                     ('language_model.lm_head.', 'lm_head.'),
                     ('multi_modal_projector.', 'model.multi_modal_projector.')):
        if key.startswith(old):
            return new + key[len(old):]
    return key


def _is_unused(name: str) -> bool:
    """The SigLIP pooling head (PaliGemma does not use it)."""
    return name.startswith('model.vision_tower.vision_model.head.')


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


def read_style(folder: Path) -> str:
    """``vla_spec_pi0fast.json``'s ``style``; LeRobot's own folders have none: "lerobot"."""
    path = folder / EXTRAS_FILE
    if not path.is_file():
        return DEFAULT_STYLE
    style = _read_json(path).get('style', DEFAULT_STYLE)
    if style not in STYLES:
        raise CheckpointError(f'{path}: style {style!r} is not one of {STYLES}')
    return style


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
    if raw.get('use_relative_actions'):
        raise CheckpointError(f'{source}: use_relative_actions (actions relative to the state) '
                              'is not supported')
    visual = _visual_keys(raw)
    if not visual and not raw.get('empty_cameras'):
        raise CheckpointError(f'{source}: no VISUAL entry in input_features')
    resolution = raw.get('image_resolution')
    if resolution is not None and [int(x) for x in resolution] != [tower.image_size] * 2:
        raise CheckpointError(f'{source}: image_resolution {resolution}; the SigLIP tower '
                              f'sees {tower.image_size} px')
    for key in visual:
        shape = raw['input_features'][key].get('shape')
        if shape and int(shape[-1]) != tower.image_size and resolution is None:
            raise CheckpointError(f'{source}: {key} has shape {shape}; the SigLIP tower sees '
                                  f'{tower.image_size} px')
    try:
        max_state = int(raw.get('max_state_dim', 32))
        state = (raw.get('input_features') or {}).get(STATE_KEY) or {}
        action = (raw.get('output_features') or {}).get('action') or {}
        max_action = int(raw.get('max_action_dim', 32))
        return Pi0FastConfig(
            vision=tower, llm=llm,
            num_image_slots=len(visual) + int(raw.get('empty_cameras') or 0),
            state_dim=int((state.get('shape') or [max_state])[-1]), max_state_dim=max_state,
            chunk_size=int(raw.get('chunk_size', 10)),
            action_dim=int((action.get('shape') or [max_action])[-1]),
            max_action_tokens=int(raw.get('max_decoding_steps',
                                          raw.get('max_action_tokens', 256))),
            fast_skip_tokens=int(raw.get('fast_skip_tokens', 128)))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f'{source}: {exc}') from exc


def config_to_json(cfg: Pi0FastConfig, dtype: str = 'float32',
                   normalization: str = 'MEAN_STD') -> dict:
    """LeRobot's config.json for ``cfg``: fields of LeRobot 0.6.1's ``PI0FastConfig`` only (the
    others take its defaults). ``dtype``: LeRobot's ("float32" or "bfloat16");
    ``normalization``: the STATE and ACTION mode of ``normalization_mapping``."""
    size = cfg.image_size
    slots = list(IMAGE_SLOTS) + [f'observation.images.camera_{i}'
                                 for i in range(3, cfg.num_image_slots)]
    features = {name: {'type': 'VISUAL', 'shape': [3, size, size]}
                for name in slots[:cfg.num_image_slots]}
    features[STATE_KEY] = {'type': 'STATE', 'shape': [cfg.state_dim]}
    return {'type': 'pi0_fast', 'input_features': features,
            'output_features': {'action': {'type': 'ACTION', 'shape': [cfg.action_dim]}},
            'paligemma_variant': 'gemma_2b', 'dtype': dtype,
            'chunk_size': cfg.chunk_size, 'n_action_steps': cfg.chunk_size,
            'max_state_dim': cfg.max_state_dim, 'max_action_dim': max(32, cfg.action_dim),
            'max_action_tokens': cfg.max_action_tokens,
            'max_decoding_steps': cfg.max_action_tokens,
            'image_resolution': [size, size], 'empty_cameras': 0,
            'tokenizer_max_length': 200, 'text_tokenizer_name': TEXT_TOKENIZER_FOLDER,
            'action_tokenizer_name': FAST_TOKENIZER_FOLDER, 'temperature': 0.0,
            'fast_skip_tokens': cfg.fast_skip_tokens, 'use_kv_cache': True,
            'use_relative_actions': False,
            'normalization_mapping': {**DEFAULT_MAPPING, 'STATE': normalization,
                                      'ACTION': normalization}}


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


def tokenizer_folder(folder: Path, raw: dict, field: str, default: str) -> Path:
    """The folder ``raw[field]`` names: relative to the checkpoint folder, or absolute."""
    name = raw.get(field) or default
    path = Path(name).expanduser()
    path = path if path.is_absolute() else folder / path
    if not path.is_dir():
        raise CheckpointError(f'{folder / "config.json"}: {field} {name!r} is not a folder '
                              f'(relative to {folder}, or absolute); hub ids are not fetched: '
                              'download it and name its folder')
    return path


# ---- weights ----------------------------------------------------------------------------

def _head_is_embeddings(files: dict, by_name: dict) -> bool:
    """True when the file's lm_head is absent or equal to its embedding table."""
    if LM_HEAD not in by_name or EMBED not in by_name:
        return True
    with safe_open(str(files[by_name[LM_HEAD]]), framework='pt') as f:
        head = f.get_tensor(by_name[LM_HEAD])
    with safe_open(str(files[by_name[EMBED]]), framework='pt') as f:
        return torch.equal(head, f.get_tensor(by_name[EMBED]))


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
    style = read_style(folder)
    files = weight_files(folder)
    by_name: dict[str, str] = {}
    for key in files:
        name = canonical_name(key)
        if name is None:
            raise CheckpointError(f'{files[key]}: unexpected key {key} (outside '
                                  f'{LEROBOT_PREFIX}*)')
        by_name[name] = key
    if EMBED not in by_name and LM_HEAD in by_name:
        by_name[EMBED] = by_name[LM_HEAD]          # LeRobot copies the head into the table
    tied = _head_is_embeddings(files, by_name)
    if not tied:
        cfg = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm,
                                                               tie_word_embeddings=False))
    with torch.device('meta'):
        model = Pi0Fast(cfg, style=style)
    ours = {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not (tied and k == OUR_LM_HEAD)}
    by_checkpoint = {by_name.get(lerobot_name(k), LEROBOT_PREFIX + lerobot_name(k)): k
                     for k in ours}
    expected = {key: ours[k] for key, k in by_checkpoint.items()}
    unused = {key for name, key in by_name.items() if _is_unused(name)}
    if tied and LM_HEAD in by_name and by_name[LM_HEAD] != by_name[EMBED]:
        unused.add(by_name[LM_HEAD])                # equal to the table: one tensor
    state = load_state_dict(folder, expected, unused, dtype, device, files)
    model.load_state_dict({k: state[key] for key, k in by_checkpoint.items()}, strict=False,
                          assign=True)
    model.language_model.tie_weights()
    return model.eval(), cfg, raw


def save_text_tokenizer(tokenizer, folder: str | os.PathLike) -> Path:
    """``tokenizers.Tokenizer`` -> ``folder``/paligemma_tokenizer/ (tokenizer.json and a
    tokenizer_config.json that ``AutoTokenizer`` reads offline)."""
    out = Path(folder) / TEXT_TOKENIZER_FOLDER
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / 'tokenizer.json'))
    (out / 'tokenizer_config.json').write_text(json.dumps({
        'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<bos>',
        'eos_token': '<eos>', 'pad_token': '<pad>', 'unk_token': '<unk>',
        'model_max_length': 1000000}, indent=2))
    return out


def save_model(model: Pi0Fast, folder: str | os.PathLike, text_tokenizer=None,
               normalization: str = 'MEAN_STD') -> None:
    """model.safetensors (LeRobot's keys, an explicit ``lm_head.weight``), config.json,
    paligemma_config.json, vla_spec_pi0fast.json (the model's style) and, when given, the text
    tokenizer (``save_text_tokenizer``). The statistics are statistics.write_statistics'."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = {LEROBOT_PREFIX + lerobot_name(k): v.detach().to('cpu').clone().contiguous()
             for k, v in model.state_dict().items()}
    save_file(state, str(folder / 'model.safetensors'), metadata={'format': 'pt'})
    dtype = 'bfloat16' if next(model.parameters()).dtype == torch.bfloat16 else 'float32'
    (folder / 'config.json').write_text(json.dumps(
        config_to_json(model.cfg, dtype, normalization), indent=2))
    (folder / PALIGEMMA_CONFIG_FILE).write_text(json.dumps(paligemma_config_json(model.cfg),
                                                           indent=2))
    (folder / EXTRAS_FILE).write_text(json.dumps({'style': model.style}, indent=2))
    if text_tokenizer is not None:
        save_text_tokenizer(text_tokenizer, folder)
