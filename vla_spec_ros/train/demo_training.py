"""Demo training, generic over the families: behaviour cloning of a family's demo preset from
scripted demonstrations (``vla-spec train-demo-vla``, train/train_demo_vla.py).

The family brings its recipe (``Family.demo_recipe(cfg, demos, out)``, in its folder): its
tokenizers, its training tensors, its model (built with ``cfg.seed``), its teacher-forced loss
and held-out metrics, and what it writes. This module brings what every recipe shares and
calls it:

    recipe = family.demo_recipe(cfg, demos, out)        # after torch.manual_seed(cfg.seed)
    loop: lr_at(step) -> rng.choice(recipe.train_index) -> random_shift(recipe.images[index])
          -> recipe.batch_loss(index, images) -> AdamW step (global-norm clipping)
          every log_every steps a record, every 10th with recipe.evaluate()
    recipe.save(out); the report: recipe.report() and the history
    a step whose loss or gradient is not finite stops the run before the optimizer step
    (divergence.py): nothing more is saved

A recipe has ``model`` (in train mode), ``images`` ((N, S, S, 3) uint8, every transition),
``train_index`` / ``val_index`` (a held-out share of the episodes), ``batch_loss(index,
images) -> (loss, token accuracy)``, ``evaluate() -> dict``, ``summary() -> str`` (printed
before the first step), ``save(out)`` and ``report() -> dict``.

AdamW (no decay on vectors, betas 0.9 / 0.95), linear warmup then cosine decay, random-shift
augmentation. Resumable: ``<work-dir>/last.pt`` holds the model, optimizer and sampler state
every ``save_every`` steps. Bitwise reproducibility needs the same torch version and thread
count (CPU kernels reduce in thread-dependent order).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..models import registry
from .divergence import check_finite_step

TRAIN_STATE = 'last.pt'


def lr_at(step: int, cfg) -> float:
    """Linear warmup, then cosine decay from ``lr`` to ``lr * min_lr_ratio`` at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def random_shift(images: torch.Tensor, max_shift: int, generator: torch.Generator
                 ) -> torch.Tensor:
    """Shift each image (B, S, S, 3) uint8 by up to ``max_shift`` pixels in x and y, filling
    with edge pixels (DrQ-style augmentation: the camera is fixed, objects move)."""
    if max_shift <= 0:
        return images
    b, s = images.shape[0], images.shape[1]
    padded = F.pad(images.permute(0, 3, 1, 2).float(), [max_shift] * 4, mode='replicate')
    offsets = torch.randint(0, 2 * max_shift + 1, (b, 2), generator=generator)
    out = torch.empty_like(images)
    for i in range(b):
        top, left = int(offsets[i, 0]), int(offsets[i, 1])
        out[i] = padded[i, :, top:top + s, left:left + s].permute(1, 2, 0).to(torch.uint8)
    return out


def start_or_resume(model, cfg, state_path: Path, resume: bool):
    """AdamW (no decay on vectors), the seeded torch and numpy generators, the history and
    step: fresh, or restored from ``state_path`` with ``resume`` (what ``save_state`` wrote).
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


def save_state(path: Path, step: int, model, optimizer, generator: torch.Generator,
               rng: np.random.Generator, history: list) -> None:
    tmp = path.with_suffix('.tmp')
    torch.save({'step': step, 'model': model.state_dict(), 'optimizer': optimizer.state_dict(),
                'generator': generator.get_state(), 'rng': rng.bit_generator.state,
                'history': history}, tmp)
    tmp.replace(path)


def fit(recipe, cfg, work_dir: Path, resume: bool) -> list[dict]:
    """The training loop over a recipe (module docstring); -> the logged records."""
    model = recipe.model
    state_path = Path(work_dir) / TRAIN_STATE
    optimizer, generator, rng, history, step = start_or_resume(model, cfg, state_path, resume)
    print(recipe.summary(), flush=True)
    started, window = time.perf_counter(), []
    while step < cfg.steps:
        for group in optimizer.param_groups:
            group['lr'] = lr_at(step, cfg)
        index = rng.choice(recipe.train_index, cfg.batch_size, replace=False)
        images = random_shift(recipe.images[torch.from_numpy(index)], cfg.max_shift, generator)
        loss, accuracy = recipe.batch_loss(index, images)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        check_finite_step(step + 1, float(loss.detach()), grad_norm)
        optimizer.step()
        step += 1
        window.append((float(loss.detach()), accuracy))
        if step % cfg.log_every == 0 or step == cfg.steps:
            record = {'step': step, 'lr': lr_at(step - 1, cfg),
                      'train_loss': float(np.mean([w[0] for w in window])),
                      'train_token_accuracy': float(np.mean([w[1] for w in window])),
                      'elapsed_s': time.perf_counter() - started}
            if step % (cfg.log_every * 10) == 0 or step == cfg.steps:
                record.update(recipe.evaluate())
            history.append(record)
            window = []
            print(json.dumps(record), flush=True)
        if step % cfg.save_every == 0:
            save_state(state_path, step, model, optimizer, generator, rng, history)
    model.eval()
    return history


def train_model(cfg, demos, out, work_dir, resume: bool = False) -> dict:
    """Trains ``cfg.family``'s demo preset on ``demos`` and writes it to ``out`` (module
    docstring); -> the report: the family, the recipe's report, the history."""
    family = registry.family(cfg.family)
    torch.manual_seed(cfg.seed)
    recipe = family.demo_recipe(cfg, demos, Path(out))
    if getattr(cfg, 'init_from', '') and not getattr(recipe, 'reads_init_from', False):
        raise ValueError(f'init_from: the {family.name} recipe starts from random weights only')
    history = fit(recipe, cfg, Path(work_dir), resume)
    recipe.save(Path(out))
    return {'family': family.name, **recipe.report(), 'history': history,
            'final': history[-1] if history else {},
            'num_train_transitions': int(len(recipe.train_index)),
            'num_val_transitions': int(len(recipe.val_index))}


__all__ = ['lr_at', 'random_shift', 'start_or_resume', 'save_state', 'fit', 'train_model',
           'TRAIN_STATE']
