"""``vla-spec train-demo-vla``: an embedded model, trained from scripted Meta-World demos.

One command, fixed seed:
  1. demonstrations: ``--data`` (a ``collect-demos`` folder), collected first when missing;
  2. the family's demo preset (``--family``, default OpenVLA's ``metaworld-demo``; the
     registry's families with a ``demo_recipe``, e.g. ``pi0fast`` for ``metaworld-demo-fast``)
     trained by behaviour cloning: train/demo_training.py runs the loop (AdamW, linear warmup,
     cosine decay, random-shift augmentation, a held-out 5 % of the episodes) over the
     family's recipe (models/<family>/demo_training.py: tokenizers, targets, teacher-forced
     loss, checkpoint in the family's layout);
  3. for a family whose draft head train-draft reads (``trains_draft_head``), its EAGLE draft
     head with ``train-draft`` on a sample of the demo images (``<out>/draft``).

Resumable: ``<work-dir>/last.pt`` holds model, optimizer and sampler state every
``--save-every`` steps; ``--resume`` continues from it. Bitwise reproducibility needs the same
torch version and thread count (CPU kernels reduce in thread-dependent order).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
import torch

from ..models import registry
from ..validation import at_least, check_number, require_int_fields
from .demo_training import train_model

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
    # The family whose demo preset is trained (models/registry.py; its demo_recipe).
    family: str = registry.DEFAULT_FAMILY.name
    # A trained checkpoint whose weights start the model, where the family's recipe reads
    # one (ECoT's: every tensor of the same shape, the action bins' token rows); '' = random.
    init_from: str = ''

    def __post_init__(self):
        require_int_fields(self, ('steps', 'batch_size', 'log_every', 'save_every',
                                  'val_every_nth_episode', 'draft_samples', 'chunk'), 1)
        require_int_fields(self, ('warmup_steps', 'max_shift', 'draft_steps'), 0)
        # Finite: an infinite lr makes every weight NaN after one step.
        for name in ('lr', 'grad_clip'):
            check_number(name, getattr(self, name), above=0)
        check_number('min_lr_ratio', self.min_lr_ratio, minimum=0, maximum=1)
        check_number('weight_decay', self.weight_decay, minimum=0)
        trainable = sorted(f.name for f in registry.FAMILIES.values() if f.demo_recipe)
        if self.family not in trainable:
            raise ValueError(f'family: must be one of {trainable}, got {self.family!r}')


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
                   'models live in vla_spec_ros/assets/)')
    p.add_argument('--data', required=True, help='collect-demos folder, or several '
                   'comma-separated (sim.demos.load_demo_sets: norm_stats over all of them)')
    p.add_argument('--collect-missing', action='store_true', help='collect the demonstrations '
                   'first (default tasks, 100 episodes per task, --seed) when the one --data '
                   'folder holds none; without it such a folder is refused (a mistyped path '
                   'must not start a quarter hour of collection)')
    p.add_argument('--work-dir', default=None, help='training state (default <out>/../'
                   '<name>-train)')
    p.add_argument('--resume', action='store_true', help='continue from <work-dir>/last.pt')
    p.add_argument('--threads', type=at_least(1), default=None,
                   help='torch CPU threads (default: torch\'s, one per core)')
    p.add_argument('--no-draft', action='store_true', help='skip the draft head')
    for field in fields(DemoTrainConfig):
        p.add_argument('--' + field.name.replace('_', '-'), type=type(field.default),
                       default=field.default)


def run(args: argparse.Namespace) -> int:
    cfg = DemoTrainConfig(**{f.name: getattr(args, f.name) for f in fields(DemoTrainConfig)})
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    from ..sim.demos import MANIFEST_FILE, collect_demos, load_demo_sets
    folders = [d for d in str(args.data).split(',') if d]
    missing = [d for d in folders if not (Path(d) / MANIFEST_FILE).is_file()]
    collect = bool(getattr(args, 'collect_missing', False))
    if not folders or (missing and not (collect and len(folders) == 1)):
        raise ValueError(f'--data: {", ".join(missing) or repr(args.data)} holds no '
                         f'demonstrations (no {MANIFEST_FILE}); collect them first with '
                         '`vla-spec collect-demos --out DIR`, or add --collect-missing to '
                         'collect into one --data folder')
    work_dir = Path(args.work_dir) if args.work_dir else out.parent / f'{out.name}-train'
    work_dir.mkdir(parents=True, exist_ok=True)
    if missing:
        from ..sim.metaworld_env import DEFAULT_TASK_NAMES
        print(f'{args.data}: no demonstrations yet; collecting them (seed {cfg.seed})')
        size = registry.preset(registry.family(cfg.family).demo_preset).image_size
        collect_demos(args.data, DEFAULT_TASK_NAMES, 100, size, seed=cfg.seed)
    demos = load_demo_sets(folders)
    if len(demos.norm_stats) != 1:
        raise ValueError(f'--data: expected one dataset in norm_stats, got '
                         f'{sorted(demos.norm_stats)}')
    started = time.time()
    # args.argv is the command line after `vla-spec`, the subcommand included.
    report = {'command': 'vla-spec ' + ' '.join(getattr(args, 'argv', ['train-demo-vla'])),
              'config': asdict(cfg), 'data': str(args.data), 'tasks': list(demos.task_names),
              'torch': torch.__version__, 'threads': torch.get_num_threads(),
              'machine': f'{platform.machine()} {platform.processor()} {os.cpu_count()} CPUs'}
    report['vla'] = train_model(cfg, demos, out, work_dir, resume=args.resume)
    report['vla_wall_s'] = time.time() - started
    # The EAGLE head, for the families whose layout train-draft reads (trains_draft_head).
    if not args.no_draft and cfg.draft_steps > 0 and registry.family(cfg.family).trains_draft_head:
        draft_started = time.time()
        report['draft'] = train_draft_head(cfg, demos, out, work_dir)
        report['draft_wall_s'] = time.time() - draft_started
    with open(out / REPORT_FILE, 'w') as f:
        json.dump(report, f, indent=2)
    print(f'wrote {out} ({report["vla_wall_s"]:.0f} s VLA training)')
    return 0
