"""pi0-FAST as a loadable family: the model with its FAST codec and prompt builder from a
LeRobot-layout folder (``load``), and random-weight checkpoints of that layout (``make_random``,
``vla-spec make-checkpoint --preset pi0fast-tiny``): weights, config.json, the PaliGemma and
style sidecars, a small Gemma-style text tokenizer, a FAST tokenizer fitted on synthetic smooth
chunks (codecs/fast_synthetic.py) and LeRobot's processor files with synthetic statistics.
``configure`` gives a preset other cameras, image size or state size; ``decodable_chunks``
makes the random model write a valid FAST frame (a test aid: decodable.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from ...codecs.fast import FastActionCodec
from ...codecs.fast_synthetic import fit_synthetic_fast_tokenizer
from ..weights import CheckpointError
from .checkpoint import (EXTRAS_FILE, FAST_TOKENIZER_FOLDER, TEXT_TOKENIZER_FOLDER, load_model,
                         save_model, tokenizer_folder)
from .config import Pi0FastConfig, config_of
from .decodable import CHAIN_LOGIT, chain_frame, chain_margin, make_decodable_
from .model import Pi0Fast
from .prompt import (ACTION_PREFIX, ACTION_SUFFIX, TOKENIZER_MAX_LENGTH, Pi0FastPrompt,
                     build_text_tokenizer)
from .statistics import read_statistics, synthetic_statistics, write_statistics
from .style import DEFAULT_STYLE, OPENPI

FAST_VOCAB_TINY = 512       # FAST ids of a random-weight checkpoint's fitted tokenizer


def prompt_builder(tokenizer, cfg: Pi0FastConfig, max_instruction_tokens: int = 128,
                   source: str = '<memory>', style: str = DEFAULT_STYLE,
                   state_normalizer=None) -> Pi0FastPrompt:
    return Pi0FastPrompt(tokenizer, state_dim=cfg.state_dim, max_state_dim=cfg.max_state_dim,
                         style=style, state_normalizer=state_normalizer,
                         max_instruction_tokens=max_instruction_tokens, source=source)


def fast_codec(fast_folder, prompt: Pi0FastPrompt, cfg: Pi0FastConfig) -> FastActionCodec:
    """The frame of the prompt's style: ``Action: `` (prefix), the FAST ids, then ``|`` as the
    end marker (LeRobot: it stops there, EOS is an ordinary token) or ``|`` (suffix) and EOS
    (openpi: the frame ends at EOS)."""
    bar = prompt.text_ids(ACTION_SUFFIX)
    if prompt.style == OPENPI:
        suffix, end = bar, prompt.eos_id
    else:
        if len(bar) != 1:
            raise ValueError(f'the text tokenizer spells "{ACTION_SUFFIX}" as {bar}, not one id')
        suffix, end = (), bar[0]
    return FastActionCodec.from_folder(
        fast_folder, action_horizon=cfg.chunk_size, action_dim=cfg.action_dim,
        vocab_size=cfg.llm.vocab_size, end_token=end,
        skip_tokens=cfg.fast_skip_tokens, prefix_tokens=prompt.text_ids(ACTION_PREFIX),
        suffix_tokens=suffix, max_tokens=cfg.max_action_tokens)


def load(folder, dtype: torch.dtype = torch.float32, device='cpu',
         max_instruction_tokens: int = 128):
    """-> (model with its codec attached, config, config.json, prompt builder, the engine's
    ``norm_stats`` from LeRobot's processor files or None when the folder has none)."""
    folder = Path(folder)
    model, cfg, raw = load_model(folder, dtype, device)
    stats = read_statistics(folder, raw, cfg.state_dim, cfg.action_dim)
    earlier_layout = (folder / 'tokenizer.json').is_file() and not (folder / str(raw.get(
        'text_tokenizer_name', TEXT_TOKENIZER_FOLDER))).is_dir()
    if earlier_layout:
        text_folder = folder        # tokenizer.json beside config.json (this package's earlier
    else:                           # layout, which LeRobot cannot read)
        text_folder = tokenizer_folder(folder, raw, 'text_tokenizer_name',
                                       TEXT_TOKENIZER_FOLDER)
    try:
        prompt = Pi0FastPrompt.from_folder(
            text_folder, state_dim=cfg.state_dim, max_state_dim=cfg.max_state_dim,
            style=model.style, max_instruction_tokens=max_instruction_tokens,
            state_normalizer=stats.state_normalizer() if stats is not None else None,
            tokenizer_max_length=int(raw.get('tokenizer_max_length', TOKENIZER_MAX_LENGTH)))
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from exc
    check_text_vocabulary(prompt.tokenizer, cfg.llm.vocab_size, text_folder / 'tokenizer.json',
                          earlier_layout)
    fast_folder = tokenizer_folder(folder, raw, 'action_tokenizer_name', FAST_TOKENIZER_FOLDER)
    if not (fast_folder / 'tokenizer.json').is_file():
        raise CheckpointError(f'missing FAST tokenizer {fast_folder / "tokenizer.json"}')
    try:
        model.attach_codec(fast_codec(fast_folder, prompt, cfg))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f'{fast_folder}: {exc}') from exc
    return model, cfg, raw, prompt, (stats.norm_stats() if stats is not None else None)


def check_text_vocabulary(tokenizer, vocab_size: int, source: Path,
                          earlier_layout: bool = False) -> None:
    """The text tokenizer must count the model's vocabulary. LeRobot maps a FAST id to the
    model id ``tokenizer.vocab_size - 1 - fast_skip_tokens - t`` with transformers'
    ``vocab_size``, which leaves added tokens out; this package maps it with the model's
    ``vocab_size``: the two must be one number (PaliGemma's: 257152 both), or the ids the
    model writes are not the FAST ids LeRobot reads and the prompt's may pass the embedding.
    The earlier layout (tokenizer.json beside config.json, which LeRobot cannot read) may hold
    its placeholders as added tokens: there the whole tokenizer counts."""
    base = tokenizer.get_vocab_size(with_added_tokens=False)
    whole = tokenizer.get_vocab_size(with_added_tokens=True)
    if base == vocab_size or (earlier_layout and whole == vocab_size):
        return
    counted = f'{base} ids' + (f' ({whole} with its added tokens)' if whole != base else '')
    raise CheckpointError(f'{source}: the text tokenizer has {counted}; the model\'s '
                          f'vocab_size is {vocab_size}: it is not this model\'s tokenizer')


def init_random_(model: Pi0Fast) -> None:
    """Small random weights keeping activations well scaled (for tests): Gemma's norm
    weights are offsets from one (near zero), SigLIP's LayerNorm gains near one. With the
    tied head, a decoder whose residual stream is mostly the input token's own (scaled)
    embedding repeats its last token forever; the embedding table is therefore drawn at 0.3
    of the usual scale and the residual branches' output projections at 8 times, so that a
    random model's greedy tokens vary (tests compare varied sequences, not one repeated id)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1 and name.endswith('layernorm.weight') \
                    and name.startswith('language_model'):
                p.normal_(0.0, 0.05)
            elif name == 'language_model.model.norm.weight':
                p.normal_(0.0, 0.05)
            elif p.dim() == 1 and 'norm' in name and name.endswith('weight'):
                p.normal_(1.0, 0.05)
            elif p.dim() == 1:
                p.normal_(0.0, 0.02)
            elif name.endswith('position_embedding.weight'):
                p.normal_(0.0, 0.02)
            else:
                fan_in = p.shape[1] if p.dim() == 2 else p[0].numel()
                p.normal_(0.0, fan_in ** -0.5)
                if name.endswith('embed_tokens.weight'):
                    p.mul_(0.3)
                elif name.startswith('language_model') and name.endswith(
                        ('o_proj.weight', 'down_proj.weight')):
                    p.mul_(8.0)


def build_model(cfg: Pi0FastConfig, dtype: torch.dtype = torch.float32, device='cpu',
                seed: int | None = None, style: str = DEFAULT_STYLE) -> Pi0Fast:
    if seed is not None:
        torch.manual_seed(seed)
    model = Pi0Fast(cfg, style=style)
    init_random_(model)
    return model.to(device=device, dtype=dtype).eval()


def random_in_memory(cfg: Pi0FastConfig, dtype: torch.dtype, device, workdir, seed: int = 0,
                     style: str = DEFAULT_STYLE):
    """What ``make_random`` then ``load`` give, without writing the weights: the model built
    and initialised directly on ``device`` in ``dtype`` (a 3B model never exists in float32
    on the host), the prompt builder over a text tokenizer of the full vocabulary, a FAST
    tokenizer fitted into ``workdir`` and synthetic statistics. For GPU benches of large
    shapes. -> (model with its codec attached, prompt builder, the engine's norm_stats)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            torch.manual_seed(seed)
            model = Pi0Fast(cfg, style=style)
            init_random_(model)
    finally:
        torch.set_default_dtype(previous)
    model = model.eval()
    stats = synthetic_statistics(cfg.action_dim, cfg.state_dim, seed)
    prompt = prompt_builder(build_text_tokenizer(cfg.llm.vocab_size), cfg, style=style,
                            state_normalizer=stats.state_normalizer())
    fast_folder = Path(workdir) / FAST_TOKENIZER_FOLDER
    fit_synthetic_fast_tokenizer(fast_folder, action_horizon=cfg.chunk_size,
                                 action_dim=cfg.action_dim, vocab_size=FAST_VOCAB_TINY,
                                 seed=seed)
    model.attach_codec(fast_codec(fast_folder, prompt, cfg))
    return model, prompt, stats.norm_stats()


def configure(cfg_or_preset: Pi0FastConfig | str, *, num_image_slots: int | None = None,
              image_size: int | None = None, state_dim: int | None = None) -> Pi0FastConfig:
    """A preset (or config) with other cameras (``num_image_slots``), another image size (every
    slot's, in pixels: LeRobot's ``image_resolution``) or another state size; None keeps the
    preset's. ``max_state_dim`` grows to ``state_dim`` when it is smaller. ValueError naming
    the field for a bad value."""
    cfg = config_of(cfg_or_preset)
    changes: dict = {}
    if num_image_slots is not None:
        changes['num_image_slots'] = num_image_slots
    if state_dim is not None:
        changes['state_dim'] = state_dim
        if isinstance(state_dim, int) and state_dim > cfg.max_state_dim:
            changes['max_state_dim'] = state_dim
    if image_size is not None:
        changes['vision'] = dataclasses.replace(cfg.vision, image_size=image_size)
    return dataclasses.replace(cfg, **changes)


def prompt_end_token(prompt: Pi0FastPrompt, state_dim: int) -> int:
    """The prompt's last id, after which the model writes its frame: the same for every
    instruction and state (BOS in LeRobot's style, the ";\\n" text in openpi's), checked."""
    ends = {prompt.encode(text, state)[-1] for text, state in (
        ('pick up the red cup', None), ('open the drawer', np.full(state_dim, 0.5)))}
    if len(ends) != 1:
        raise ValueError(f'decodable chunks: the prompt ends in different ids {sorted(ends)}')
    return ends.pop()


def make_random(cfg_or_preset: Pi0FastConfig | str, out, seed: int = 0,
                dtype: str = 'float32', style: str = DEFAULT_STYLE,
                decodable_chunks: bool = False) -> Path:
    """A random-weight pi0-FAST checkpoint in LeRobot's layout (module docstring).
    ``decodable_chunks``: greedy decoding writes one valid FAST frame whatever the observation
    (a test aid, decodable.py); ``vla_spec_pi0fast.json`` records it under ``decodable``."""
    cfg = config_of(cfg_or_preset)
    out = Path(out)
    torch_dtype = {'float32': torch.float32, 'float64': torch.float64,
                   'bfloat16': torch.bfloat16, 'float16': torch.float16}[dtype]
    stats = synthetic_statistics(cfg.action_dim, cfg.state_dim, seed)
    if not decodable_chunks:
        model = build_model(cfg, torch_dtype, seed=seed, style=style)
        save_model(model, out, text_tokenizer=build_text_tokenizer(cfg.llm.vocab_size))
        fit_synthetic_fast_tokenizer(out / FAST_TOKENIZER_FOLDER,
                                     action_horizon=cfg.chunk_size, action_dim=cfg.action_dim,
                                     vocab_size=FAST_VOCAB_TINY, seed=seed)
    else:
        text_tokenizer = build_text_tokenizer(cfg.llm.vocab_size)
        fit_synthetic_fast_tokenizer(out / FAST_TOKENIZER_FOLDER,
                                     action_horizon=cfg.chunk_size, action_dim=cfg.action_dim,
                                     vocab_size=FAST_VOCAB_TINY, seed=seed)
        prompt = prompt_builder(text_tokenizer, cfg, style=style,
                                state_normalizer=stats.state_normalizer())
        codec = fast_codec(out / FAST_TOKENIZER_FOLDER, prompt, cfg)
        start = prompt_end_token(prompt, cfg.state_dim)
        frame, chunk = chain_frame(codec, start, cfg.llm.hidden_size, seed)
        untied = dataclasses.replace(cfg, llm=dataclasses.replace(cfg.llm,
                                                                  tie_word_embeddings=False))
        # Set in float32, then cast: the chain's margin is checked in the written dtype.
        model = build_model(untied, torch.float32, seed=seed, style=style)
        make_decodable_(model, start, frame)
        model = model.to(torch_dtype)
        margin = chain_margin(model, start, frame)
        if margin < CHAIN_LOGIT / 2:
            raise ValueError(f'decodable chunks: the chain\'s margin is {margin:.2f} in {dtype} '
                             f'(want >= {CHAIN_LOGIT / 2})')
        save_model(model, out, text_tokenizer=text_tokenizer)
        extras = json.loads((out / EXTRAS_FILE).read_text())
        extras['decodable'] = {'frame': list(frame), 'chunk': np.asarray(chunk).tolist()}
        (out / EXTRAS_FILE).write_text(json.dumps(extras, indent=2))
    raw = json.loads((out / 'config.json').read_text())
    write_statistics(out, stats, raw)
    return out
