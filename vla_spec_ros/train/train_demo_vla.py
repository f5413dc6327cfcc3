"""``vla-spec train-demo-vla``: the embedded default model, trained from scripted Meta-World demos.

One command, fixed seed:
  1. demonstrations: ``--data`` (a ``collect-demos`` folder), collected first when missing;
  2. tokenizer: BPE learned from the tasks' instruction prompts (prompt.build_instruction_
     tokenizer), the last 256 of its 512 ids reserved for the action bins;
  3. behaviour cloning of the ``metaworld-demo`` preset (same OpenVLA model code as inference):
     OpenVLA's objective, cross-entropy on the 7 action tokens given image + prompt (with
     ``--chunk K``: the 7 K tokens of the next K control steps of the episode, the last step
     repeated past its end), with the
     actions normalised by the dataset's q01/q99 and binned by ``ActionTokenizer``; random-shift
     image augmentation; AdamW, linear warmup, cosine decay; a held-out 5 % of the episodes for
     token accuracy and bin error;
  4. the checkpoint in OpenVLA's layout (safetensors, config.json with norm_stats, tokenizer);
  5. its EAGLE draft head with ``train-draft`` on a sample of the demo images (``<out>/draft``).

``--family pi0fast`` trains the pi0-FAST model ``metaworld-demo-fast`` instead
(train/train_demo_fast.py: FAST tokenizer fitted on the training chunks, PaliGemma layout).

Resumable: ``<work-dir>/last.pt`` holds model, optimizer and sampler state every
``--save-every`` steps; ``--resume`` continues from it. Bitwise reproducibility needs the same
torch version and thread count (CPU kernels reduce in thread-dependent order).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..actions import ActionStats, ActionTokenizer
from ..config import config_to_dict, preset
from ..validation import require_int_fields
from ..models.openvla.checkpoint import build_model, save_model
from ..prompt import PromptTokenizer, build_instruction_tokenizer, save_tokenizer
from .teacher_forcing import action_logits, build_sequences, pixel_values_batch, random_shift

PRESET = 'metaworld-demo'
FAMILIES = ('openvla', 'pi0fast')     # pi0fast: train/train_demo_fast.py
TRAIN_STATE = 'last.pt'
REPORT_FILE = 'training.json'


@dataclass(frozen=True)
class DemoTrainConfig:
    steps: int = 6000
    batch_size: int = 64
    lr: float = 1e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 200
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_shift: int = 4              # pixels of random-shift augmentation
    val_every_nth_episode: int = 20  # episodes with index % n == 0 are held out
    log_every: int = 100
    save_every: int = 500
    draft_steps: int = 1500
    draft_samples: int = 4000
    chunk: int = 1                  # control steps one frame decodes (1: OpenVLA's one step)
    seed: int = 0
    family: str = 'openvla'         # 'openvla' (metaworld-demo) or 'pi0fast' (-fast)

    def __post_init__(self):
        require_int_fields(self, ('steps', 'batch_size', 'log_every', 'save_every',
                                  'val_every_nth_episode', 'draft_samples', 'chunk'), 1)
        require_int_fields(self, ('warmup_steps', 'max_shift', 'draft_steps'), 0)
        for name in ('lr', 'grad_clip'):
            if not getattr(self, name) > 0:
                raise ValueError(f'{name}: must be > 0, got {getattr(self, name)}')
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f'min_lr_ratio: must lie in [0, 1], got {self.min_lr_ratio}')
        if not self.weight_decay >= 0:
            raise ValueError(f'weight_decay: must be >= 0, got {self.weight_decay}')
        if self.family not in FAMILIES:
            raise ValueError(f'family: must be one of {FAMILIES}, got {self.family!r}')


def lr_at(step: int, cfg: DemoTrainConfig) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``lr * min_lr_ratio`` at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


@dataclass
class DemoTensors:
    """The dataset as training tensors, split by episode into train and held-out parts."""

    images: torch.Tensor            # (N, S, S, 3) uint8
    action_tokens: np.ndarray       # (N, 7 * chunk) int64
    prompt_ids: list                # per sample: prompt ids (BOS first)
    train_index: np.ndarray
    val_index: np.ndarray


def chunk_actions(actions: np.ndarray, episode_index: np.ndarray, chunk: int) -> np.ndarray:
    """(N, D) actions in episode order -> (N, chunk, D): each transition's action and the next
    chunk - 1 of its episode, the episode's last action repeated past its end."""
    out = np.empty((len(actions), chunk, actions.shape[1]), dtype=actions.dtype)
    starts = np.flatnonzero(np.r_[True, episode_index[1:] != episode_index[:-1]])
    ends = np.r_[starts[1:], len(actions)]
    for start, end in zip(starts, ends):
        for k in range(chunk):
            rows = np.minimum(np.arange(start, end) + k, end - 1)
            out[start:end, k] = actions[rows]
    return out


def prepare_tensors(demos, tokenizer: PromptTokenizer, action_tokenizer: ActionTokenizer,
                    stats: ActionStats, image_size: int, val_every_nth_episode: int,
                    chunk: int = 1) -> DemoTensors:
    if demos.images.shape[1:3] != (image_size, image_size):
        raise ValueError(f'--data: images are {demos.images.shape[1:3]} pixels; the '
                         f'{PRESET} preset needs {image_size} x {image_size} (collect with '
                         f'--image-size {image_size})')
    by_text = {text: tokenizer.encode(text) for text in np.unique(demos.instructions)}
    prompt_ids = [by_text[text] for text in demos.instructions]
    actions = chunk_actions(demos.actions, demos.episode_index, chunk)
    tokens = action_tokenizer.encode(stats.normalize(actions)).reshape(len(actions), -1)
    is_val = demos.episode_index % val_every_nth_episode == 0
    return DemoTensors(torch.from_numpy(demos.images), tokens.astype(np.int64), prompt_ids,
                       np.flatnonzero(~is_val), np.flatnonzero(is_val))


def batch_loss(model, data: DemoTensors, index: np.ndarray, cfg, pad_id: int,
               generator: torch.Generator | None, max_shift: int):
    """Cross-entropy over the action tokens of samples ``index``; also returns the argmax."""
    images = data.images[torch.from_numpy(index)]
    if generator is not None:
        images = random_shift(images, max_shift, generator)
    targets = data.action_tokens[index]
    ids, text_lens = build_sequences([data.prompt_ids[i] for i in index], targets, pad_id)
    logits = action_logits(model, pixel_values_batch(images, cfg), ids, text_lens,
                           targets.shape[1])
    target_t = torch.from_numpy(targets)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_t.reshape(-1))
    return loss, logits.argmax(-1), target_t


@torch.no_grad()
def evaluate(model, data: DemoTensors, cfg, pad_id: int, batch_size: int = 256) -> dict:
    """Held-out token accuracy, mean |bin error| per action dimension, mean loss."""
    model.eval()
    losses, correct, bin_err, count = [], 0, None, 0
    for start in range(0, len(data.val_index), batch_size):
        index = data.val_index[start:start + batch_size]
        loss, pred, target = batch_loss(model, data, index, cfg, pad_id, None, 0)
        losses.append(float(loss) * len(index))
        correct += int((pred == target).sum())
        err = (pred - target).abs().double().sum(0)
        bin_err = err if bin_err is None else bin_err + err
        count += len(index)
    model.train()
    if count == 0:
        return {}
    return {'val_loss': sum(losses) / count,
            'val_token_accuracy': correct / (count * data.action_tokens.shape[1]),
            'val_mean_bin_error': (bin_err / count).tolist()}


def _start_or_resume(model, cfg, state_path: Path, resume: bool):
    """AdamW (no decay on vectors), the seeded torch and numpy generators, the history and
    step: fresh, or restored from ``state_path`` with ``resume`` (what ``_save_state`` wrote).
    -> (optimizer, generator, rng, history, step)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{'params': decay, 'weight_decay': cfg.weight_decay},
                                   {'params': no_decay, 'weight_decay': 0.0}],
                                  lr=cfg.lr, betas=(0.9, 0.95))
    generator = torch.Generator().manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    history, step = [], 0
    if resume and state_path.is_file():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state['model'])
        optimizer.load_state_dict(state['optimizer'])
        generator.set_state(state['generator'])
        rng.bit_generator.state = state['rng']
        history, step = state['history'], state['step']
        print(f'resumed from {state_path} at step {step}')
    return optimizer, generator, rng, history, step


def _save_state(path: Path, step: int, model, optimizer, generator: torch.Generator,
                rng: np.random.Generator, history: list) -> None:
    tmp = path.with_suffix('.tmp')
    torch.save({'step': step, 'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                'generator': generator.get_state(), 'rng': rng.bit_generator.state,
                'history': history}, tmp)
    tmp.replace(path)


def train_vla(args, cfg: DemoTrainConfig, demos, out: Path, work_dir: Path) -> dict:
    torch.manual_seed(cfg.seed)
    vla_cfg = dataclasses.replace(preset(PRESET), action_chunk=cfg.chunk)
    task_instructions = sorted({text for text in demos.instructions})
    tok = build_instruction_tokenizer(task_instructions, vla_cfg.pad_token_id,
                                      vla_cfg.n_action_bins)
    tokenizer = PromptTokenizer(tok)
    action_tokenizer = ActionTokenizer(vla_cfg.llm.vocab_size, vla_cfg.pad_to_multiple_of,
                                       vla_cfg.n_action_bins, vla_cfg.action_dim,
                                       vla_cfg.action_chunk)
    (dataset_name, entry), = demos.norm_stats.items()
    stats = ActionStats.from_norm_stats(entry, dataset_name)
    data = prepare_tensors(demos, tokenizer, action_tokenizer, stats, vla_cfg.image_size,
                           cfg.val_every_nth_episode, cfg.chunk)
    model = build_model(vla_cfg, torch.float32, 'cpu', cfg.seed).train()
    state_path = work_dir / TRAIN_STATE
    optimizer, generator, rng, history, step = _start_or_resume(model, cfg, state_path,
                                                                args.resume)
    print(f'{PRESET}: {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; '
          f'{len(data.train_index)} training / {len(data.val_index)} held-out transitions')
    started, window = time.perf_counter(), []
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group['lr'] = lr_at(step, cfg)
        index = rng.choice(data.train_index, cfg.batch_size, replace=False)
        loss, pred, target = batch_loss(model, data, index, vla_cfg, vla_cfg.pad_token_id,
                                        generator, cfg.max_shift)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        step += 1
        window.append((float(loss.detach()), float((pred == target).float().mean())))
        if step % cfg.log_every == 0 or step == cfg.steps:
            record = {'step': step, 'lr': lr_at(step - 1, cfg),
                      'train_loss': float(np.mean([w[0] for w in window])),
                      'train_token_accuracy': float(np.mean([w[1] for w in window])),
                      'elapsed_s': time.perf_counter() - started}
            if step % (cfg.log_every * 10) == 0 or step == cfg.steps:
                record.update(evaluate(model, data, vla_cfg, vla_cfg.pad_token_id))
            history.append(record)
            window = []
            print(json.dumps(record), flush=True)
        if step % cfg.save_every == 0:
            _save_state(state_path, step, model, optimizer, generator, rng, history)
    model.eval()
    save_model(model, vla_cfg, out, demos.norm_stats, unused_seed=cfg.seed)
    save_tokenizer(tok, out)
    return {'preset': PRESET, 'model_config': config_to_dict(vla_cfg), 'history': history,
            'final': history[-1] if history else {},
            'num_train_transitions': int(len(data.train_index)),
            'num_val_transitions': int(len(data.val_index))}


def train_draft_head(cfg: DemoTrainConfig, demos, out: Path, work_dir: Path) -> dict:
    """EAGLE draft head on a seeded sample of the demo observations (train-draft's recipe)."""
    from . import train_draft
    rng = np.random.default_rng(cfg.seed + 1)
    pick = np.sort(rng.choice(len(demos.images), min(cfg.draft_samples, len(demos.images)),
                              replace=False))
    obs_path = work_dir / 'draft_observations.npz'
    np.savez(obs_path, images=demos.images[pick], instructions=demos.instructions[pick])
    argv = ['--model', str(out), '--data', str(obs_path), '--out', str(out / 'draft'),
            '--work-dir', str(work_dir / 'draft'), '--steps', str(cfg.draft_steps),
            '--batch-size', '16', '--lr', '3e-3', '--warmup-steps', '100',
            '--seed', str(cfg.seed), '--no-progress']
    code = train_draft.main(argv)
    if code != 0:
        raise RuntimeError(f'train-draft failed with exit code {code}')
    return {'command': 'vla-spec train-draft ' + ' '.join(argv), 'num_observations': len(pick)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument('--out', required=True, help='checkpoint folder to write (the embedded '
                   'model lives in vla_spec_ros/assets/metaworld-demo)')
    p.add_argument('--data', required=True, help='collect-demos folder (collected with the '
                   'default tasks, 100 episodes per task and --seed when missing)')
    p.add_argument('--work-dir', default=None, help='training state (default <out>/../'
                   '<name>-train)')
    p.add_argument('--resume', action='store_true', help='continue from <work-dir>/last.pt')
    p.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    p.add_argument('--no-draft', action='store_true', help='skip the draft head')
    for field in fields(DemoTrainConfig):
        p.add_argument('--' + field.name.replace('_', '-'), type=type(field.default),
                       default=field.default)


def run(args: argparse.Namespace) -> int:
    cfg = DemoTrainConfig(**{f.name: getattr(args, f.name) for f in fields(DemoTrainConfig)})
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    work_dir = Path(args.work_dir) if args.work_dir else out.parent / f'{out.name}-train'
    work_dir.mkdir(parents=True, exist_ok=True)
    from ..sim.demos import MANIFEST_FILE, collect_demos, load_demos
    if not (Path(args.data) / MANIFEST_FILE).is_file():
        from ..sim.metaworld_env import DEFAULT_TASK_NAMES
        print(f'{args.data}: no demonstrations yet; collecting them (seed {cfg.seed})')
        collect_demos(args.data, DEFAULT_TASK_NAMES, 100, preset(PRESET).image_size,
                      seed=cfg.seed)
    demos = load_demos(args.data)
    if len(demos.norm_stats) != 1:
        raise ValueError(f'--data: expected one dataset in norm_stats, got '
                         f'{sorted(demos.norm_stats)}')
    started = time.time()
    # args.argv is the command line after `vla-spec`, the subcommand included.
    report = {'command': 'vla-spec ' + ' '.join(getattr(args, 'argv', ['train-demo-vla'])),
              'config': asdict(cfg), 'data': str(args.data), 'tasks': list(demos.task_names),
              'torch': torch.__version__, 'threads': torch.get_num_threads(),
              'machine': f'{platform.machine()} {platform.processor()} {os.cpu_count()} CPUs'}
    if cfg.family == 'pi0fast':
        from .train_demo_fast import train_fast
        report['vla'] = train_fast(args, cfg, demos, out, work_dir)
    else:
        report['vla'] = train_vla(args, cfg, demos, out, work_dir)
    report['vla_wall_s'] = time.time() - started
    # The EAGLE head is trained for the OpenVLA family only (train_draft reads its layout).
    if not args.no_draft and cfg.draft_steps > 0 and cfg.family == 'openvla':
        draft_started = time.time()
        report['draft'] = train_draft_head(cfg, demos, out, work_dir)
        report['draft_wall_s'] = time.time() - draft_started
    with open(out / REPORT_FILE, 'w') as f:
        json.dump(report, f, indent=2)
    print(f'wrote {out} ({report["vla_wall_s"]:.0f} s VLA training)')
    return 0
