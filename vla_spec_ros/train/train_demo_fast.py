"""``vla-spec train-demo-vla --family pi0fast``: the embedded pi0-FAST model
(``metaworld-demo-fast``), trained from the same scripted Meta-World demos as ``metaworld-demo``.

1. text tokenizer: the family's small Gemma-style BPE (models/pi0fast/prompt.py) over the
   prompt's words and the tasks' instructions, 1024 ids in all;
2. chunks: each transition's action and the next H - 1 of its episode (the last repeated past
   its end), normalised by the dataset's q01/q99 (``ActionStats``) and clipped to [-1, 1];
3. FAST tokenizer fitted on the TRAINING episodes' chunks only (codecs/fast_tokenizer.py), plus
   the two constant chunks -1 and +1 so that every normalised chunk stays encodable (a draft
   re-encoding any chunk never meets a coefficient below ``min_token``; fast_synthetic.py);
4. behaviour cloning in the family's own layout: image patches, ``[BOS] Task: ..., State:
   ...;\\n`` (zeros: the demos carry no proprioception), then the generated frame ``Action: ``
   + FAST ids + ``|`` + EOS (the codec's ``encode``), cross-entropy on every generated token
   (openpi's loss), teacher-forced with the prefix-LM mask (train/prefix_lm_forcing.py);
   random-shift augmentation, AdamW, warmup + cosine (train_demo_vla's schedule and config);
5. the checkpoint in LeRobot's layout (models/pi0fast/checkpoint.py), ``max_action_tokens`` =
   the longest training frame + ``FRAME_MARGIN``.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..actions import ActionStats
from ..config import config_to_dict, preset
from ..codecs.fast_tokenizer import fit_fast_tokenizer
from ..models.pi0fast.checkpoint import FAST_TOKENIZER_FOLDER, save_model
from ..models.pi0fast.family import build_model, fast_codec, prompt_builder
from ..models.pi0fast.prompt import build_text_tokenizer
from ..models.pi0fast.style import OPENPI
from .prefix_lm_forcing import pixel_values_pi0fast, prefix_lm_batch, prefix_lm_logits
from .teacher_forcing import random_shift

PRESET = 'metaworld-demo-fast'
FAST_VOCAB_SIZE = 512           # BPE ids asked for (1024 - 256 text - 128 skipped leaves 640)
FRAME_MARGIN = 8                # tokens beyond the longest training frame (max_action_tokens)
TRAIN_STATE = 'last.pt'
# openpi's conventions (models/pi0fast/style.py): the frame ends at EOS after "|", the
# instruction lower-cased; what the shipped model was trained with.
STYLE = OPENPI


@dataclass
class FastDemoTensors:
    images: torch.Tensor            # (N, S, S, 3) uint8
    targets: list                   # per sample: the frame's token ids (codec.encode)
    prompt_ids: list                # per sample: prompt ids (BOS first)
    train_index: np.ndarray
    val_index: np.ndarray


def normalized_chunks(demos, stats: ActionStats, horizon: int) -> np.ndarray:
    """(N, H, D) normalised chunks in [-1, 1], one per transition."""
    from .train_demo_vla import chunk_actions
    chunks = chunk_actions(demos.actions, demos.episode_index, horizon)
    return np.clip(stats.normalize(chunks), -1.0, 1.0)


def fit_codec_tokenizer(chunks: np.ndarray, train_index: np.ndarray, folder: Path):
    """FAST on the training chunks, plus the constant chunks -1 and +1 (module docstring)."""
    horizon, dim = chunks.shape[1:]
    extremes = np.stack([np.full((horizon, dim), v) for v in (-1.0, 1.0)])
    return fit_fast_tokenizer(np.concatenate([chunks[train_index], extremes]),
                              vocab_size=FAST_VOCAB_SIZE, folder=folder)


def batch_loss(model, data: FastDemoTensors, index: np.ndarray, num_patches: int, pad_id: int,
               generator: torch.Generator | None, max_shift: int):
    images = data.images[torch.from_numpy(index)]
    if generator is not None:
        images = random_shift(images, max_shift, generator)
    ids, _, mask, target, rows = prefix_lm_batch([data.prompt_ids[i] for i in index],
                                                 [data.targets[i] for i in index],
                                                 num_patches, pad_id)
    logits = prefix_lm_logits(model, pixel_values_pi0fast(images), ids, mask, rows)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1),
                           ignore_index=-100)
    return loss, logits.argmax(-1), target


@torch.no_grad()
def evaluate(model, data: FastDemoTensors, num_patches: int, pad_id: int,
             batch_size: int = 128) -> dict:
    """Held-out teacher-forced loss, token accuracy and whole-frame accuracy."""
    model.eval()
    loss_sum, correct, frames_right, count, num_tokens = 0.0, 0, 0, 0, 0
    for start in range(0, len(data.val_index), batch_size):
        index = data.val_index[start:start + batch_size]
        loss, pred, target = batch_loss(model, data, index, num_patches, pad_id, None, 0)
        valid = target != -100
        loss_sum += float(loss) * int(valid.sum())
        correct += int(((pred == target) & valid).sum())
        frames_right += int(((pred == target) | ~valid).all(1).sum())
        num_tokens += int(valid.sum())
        count += len(index)
    model.train()
    if count == 0:
        return {}
    return {'val_loss': loss_sum / num_tokens, 'val_token_accuracy': correct / num_tokens,
            'val_frame_accuracy': frames_right / count}


def train_fast(args, cfg, demos, out: Path, work_dir: Path) -> dict:
    """Steps 1-5 of the module docstring; ``cfg`` is train_demo_vla.DemoTrainConfig."""
    from .train_demo_vla import _save_state, _start_or_resume, lr_at
    if cfg.chunk < 2:
        raise ValueError(f'chunk: the pi0fast family decodes chunks of H >= 2 control steps '
                         f'(FAST compresses a chunk over time), got {cfg.chunk}')
    torch.manual_seed(cfg.seed)
    out.mkdir(parents=True, exist_ok=True)
    base = preset(PRESET)
    if demos.images.shape[1:3] != (base.image_size, base.image_size):
        raise ValueError(f'--data: images are {demos.images.shape[1:3]} pixels; {PRESET} '
                         f'needs {base.image_size} x {base.image_size}')
    instructions = sorted({str(text) for text in demos.instructions})
    text_tok = build_text_tokenizer(base.llm.vocab_size, instructions=instructions)
    (dataset_name, entry), = demos.norm_stats.items()
    stats = ActionStats.from_norm_stats(entry, dataset_name)
    is_val = demos.episode_index % cfg.val_every_nth_episode == 0
    train_index, val_index = np.flatnonzero(~is_val), np.flatnonzero(is_val)
    chunks = normalized_chunks(demos, stats, cfg.chunk)
    fast = fit_codec_tokenizer(chunks, train_index, out / FAST_TOKENIZER_FOLDER)
    vla_cfg = dataclasses.replace(base, chunk_size=cfg.chunk, action_dim=chunks.shape[2])
    prompt = prompt_builder(text_tok, vla_cfg, style=STYLE)
    codec = fast_codec(out / FAST_TOKENIZER_FOLDER, prompt, vla_cfg)
    targets = [codec.encode(c) for c in chunks]
    longest = max(len(t) for t in targets)
    vla_cfg = dataclasses.replace(vla_cfg, max_action_tokens=longest + FRAME_MARGIN)
    by_text = {text: prompt.encode(text) for text in instructions}
    data = FastDemoTensors(torch.from_numpy(demos.images), targets,
                           [by_text[str(t)] for t in demos.instructions], train_index,
                           val_index)
    pad_id = text_tok.token_to_id('<pad>')
    model = build_model(vla_cfg, torch.float32, 'cpu', cfg.seed, style=STYLE).train()
    state_path = work_dir / TRAIN_STATE
    optimizer, generator, rng, history, step = _start_or_resume(model, cfg, state_path,
                                                                args.resume)
    lengths = np.array([len(t) for t in targets])
    print(f'{PRESET}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; '
          f'{len(train_index)} training / {len(val_index)} held-out transitions; FAST '
          f'{fast.num_ids} ids, frames of {lengths.min()}-{longest} tokens '
          f'(mean {lengths.mean():.1f})', flush=True)
    num_patches = vla_cfg.num_patches
    started, window = time.perf_counter(), []
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group['lr'] = lr_at(step, cfg)
        index = rng.choice(train_index, cfg.batch_size, replace=False)
        loss, pred, target = batch_loss(model, data, index, num_patches, pad_id, generator,
                                        cfg.max_shift)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        valid = target != -100
        window.append((float(loss.detach()),
                       float(((pred == target) & valid).sum() / valid.sum())))
        if step % cfg.log_every == 0 or step == cfg.steps:
            record = {'step': step, 'lr': lr_at(step - 1, cfg),
                      'train_loss': float(np.mean([w[0] for w in window])),
                      'train_token_accuracy': float(np.mean([w[1] for w in window])),
                      'elapsed_s': time.perf_counter() - started}
            if step % (cfg.log_every * 10) == 0 or step == cfg.steps:
                record.update(evaluate(model, data, num_patches, pad_id))
            history.append(record)
            window = []
            print(json.dumps(record), flush=True)
        if step % cfg.save_every == 0:
            _save_state(state_path, step, model, optimizer, generator, rng, history)
    model.eval()
    save_model(model, out)
    text_tok.save(str(out / 'tokenizer.json'))
    (out / 'dataset_statistics.json').write_text(json.dumps(demos.norm_stats, indent=2))
    return {'preset': PRESET, 'family': 'pi0fast', 'style': STYLE,
            'model_config': config_to_dict(vla_cfg),
            'fast': {'num_ids': fast.num_ids, 'min_token': fast.params.min_token,
                     'scale': fast.params.scale, 'fitted_on': 'training episodes only',
                     'frame_tokens': {'min': int(lengths.min()), 'max': int(longest),
                                      'mean': float(lengths.mean())}},
            'history': history, 'final': history[-1] if history else {},
            'num_train_transitions': int(len(train_index)),
            'num_val_transitions': int(len(val_index))}
