"""``vla-spec train-draft``: train an EAGLE draft head on the verifier's own greedy outputs.

EAGLE losses (docs/speculation.md, Training data and losses): SmoothL1 regression of the verifier's
next feature plus ``p_weight`` x soft cross-entropy of the draft's logits (through the verifier's
frozen lm_head) against the verifier's distribution, averaged over the loss positions (EAGLE's
normalisation, not Spec-VLA's B x seq_len); uniform noise on the INPUT features only; AdamW with
betas (0.9, 0.95), linear warmup then linear decay, global-norm gradient clipping. Loss positions
are those the verifier asks the draft for (draft predicts a_2..a_A; see
``draft_data.PackedDraftBatch``); the prefix is attention context as at inference.

Runs in one process or under ``torchrun`` (DDP; the process group is created only when
``WORLD_SIZE`` > 1, gloo on CPU, nccl on CUDA). Work folder (``--work-dir``, default
``<out>/train``): ``data/`` (generated samples, reused while the settings match) and
``checkpoints/step-<N>/`` (draft weights + optimizer state, every ``--save-every`` steps;
``--resume`` continues from the newest). The final head goes to ``--out`` and loads with
``models.draft.load_draft``; an ``--out`` that holds a model checkpoint (the ``--model`` folder
itself, or any folder whose weights are not a draft head's) is refused before anything runs,
unless ``--force`` (draft_out.py).

Observations come from ``--data`` (``draft_data.load_observations``) or from a ROS 2 bag
(``--bag`` with ``--image-topic`` / ``--instruction-topic``, ``bag_frames``); both give the
same ``ObservationSet``, and everything after that is shared.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..devices import parse_device
from ..validation import at_least, check_number, require_int_fields
from ..models.draft import DraftConfig, EagleDraftHead, load_draft, new_draft_head, save_draft
from ..recording import DEFAULT_IMAGE_TOPIC, DEFAULT_INSTRUCTION_TOPIC
from .draft_data import (DraftDataset, generate_shards, load_observations, pack_samples,
                         read_manifest, write_manifest)
from .divergence import check_finite_step
from .draft_out import check_draft_out

CHECKPOINTS = 'checkpoints'
TRAIN_STATE = 'train_state.json'
OPTIMIZER_FILE = 'optimizer.safetensors'


@dataclass(frozen=True)
class TrainDraftConfig:
    steps: int = 2000
    batch_size: int = 4             # samples per process and step
    lr: float = 5e-5                # Spec-VLA's DeepSpeed lr
    warmup_steps: int = 100
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 0.5          # global norm (Spec-VLA ds_config gradient_clipping)
    noise: float = 0.1              # half-width of U(-noise, noise) on input features (paper)
    v_weight: float = 1.0
    p_weight: float = 0.1
    save_every: int = 500
    keep_checkpoints: int = 2
    log_every: int = 50
    seed: int = 0

    def __post_init__(self):
        require_int_fields(self, ('steps', 'batch_size', 'save_every', 'keep_checkpoints',
                                  'log_every'), 1)
        require_int_fields(self, ('warmup_steps',), 0)
        # Finite: an infinite lr or weight makes every weight NaN after one step.
        for name in ('lr', 'grad_clip'):
            check_number(name, getattr(self, name), above=0)
        for name in ('weight_decay', 'noise', 'v_weight', 'p_weight'):
            check_number(name, getattr(self, name), minimum=0)
        for name in ('beta1', 'beta2'):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f'{name}: must lie in [0, 1), got {getattr(self, name)}')


def lr_at(step: int, cfg: TrainDraftConfig) -> float:
    """Linear warmup over ``warmup_steps``, then linear decay to 0 at ``steps``."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    remaining = cfg.steps - cfg.warmup_steps
    return cfg.lr * max(0.0, (cfg.steps - step) / remaining) if remaining > 0 else cfg.lr


def batch_indices(step: int, num_samples: int, batch_size: int, rank: int, world_size: int,
                  seed: int) -> list[int]:
    """Sample ids of (step, rank): epochs of seeded permutations, consumed in order.

    A pure function of its arguments, so a resumed run sees exactly the batches it would have.
    """
    global_batch = batch_size * world_size
    first = step * global_batch + rank * batch_size
    out, perms = [], {}
    for i in range(first, first + batch_size):
        epoch = i // num_samples
        if epoch not in perms:
            gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            perms[epoch] = torch.randperm(num_samples, generator=gen).tolist()
        out.append(perms[epoch][i % num_samples])
    return out


def draft_loss(head: nn.Module, core: EagleDraftHead, packed, cfg: TrainDraftConfig,
               noise_gen: torch.Generator | None) -> tuple[torch.Tensor, dict]:
    """EAGLE loss on one packed batch. ``head`` may be the DDP wrapper of ``core``."""
    features = packed.features
    if noise_gen is not None and cfg.noise > 0:
        noise = torch.rand(features.shape, generator=noise_gen, dtype=features.dtype)
        features = features + (noise.to(features.device) * 2 - 1) * cfg.noise
    cache = core.new_kv_cache(packed.inputs_embeds.shape[0])
    hidden = head(packed.inputs_embeds, features, packed.batch, cache)
    pred = hidden[packed.loss_rows]                                       # (R, H)
    v_loss = F.smooth_l1_loss(pred, packed.targets, reduction='none').mean(-1).mean()
    log_p = torch.log_softmax(core.logits(pred), dim=-1)
    with torch.no_grad():
        target_p = torch.softmax(core.logits(packed.targets), dim=-1)
    p_loss = -(target_p * log_p).sum(-1).mean()
    loss = cfg.v_weight * v_loss + cfg.p_weight * p_loss
    agreement = (log_p.argmax(-1) == packed.target_tokens).float().mean()
    return loss, {'loss': loss.item(), 'v_loss': v_loss.item(), 'p_loss': p_loss.item(),
                  'top1': float(agreement)}


@torch.no_grad()
def evaluate_agreement(core: EagleDraftHead, data: DraftDataset, device, batch_size: int = 16,
                       max_samples: int = 512) -> float:
    """Teacher-forced top-1 agreement with the verifier's tokens on the loss positions
    (the first ``max_samples`` samples)."""
    hits = total = 0
    num_samples = min(len(data), max_samples)
    for start in range(0, num_samples, batch_size):
        samples = [data[i] for i in range(start, min(start + batch_size, num_samples))]
        packed = pack_samples(samples, core.embed, device, core.fc.weight.dtype)
        hidden = core(packed.inputs_embeds, packed.features, packed.batch,
                      core.new_kv_cache(packed.inputs_embeds.shape[0]))
        tokens = core.logits(hidden[packed.loss_rows]).argmax(-1)
        hits += int((tokens == packed.target_tokens).sum())
        total += int(tokens.numel())
    return hits / max(total, 1)


# ---- frozen verifier pieces -------------------------------------------------------------------

class FrozenVerifierHead(nn.Module):
    """The verifier's embedding and lm_head only (float32 copies, frozen), shaped like a
    ``LlamaForCausalLM`` for ``new_draft_head`` / ``load_draft``; the rest is freed."""

    def __init__(self, lm, dtype: torch.dtype, device):
        super().__init__()
        self.cfg = lm.cfg
        embed = nn.Embedding(lm.cfg.vocab_size, lm.cfg.hidden_size)
        head = nn.Linear(lm.cfg.hidden_size, lm.cfg.vocab_size, bias=False)
        with torch.no_grad():
            embed.weight.copy_(lm.model.embed_tokens.weight)
            head.weight.copy_(lm.lm_head.weight)
        self.embed_tokens = embed.to(device, dtype).requires_grad_(False)
        self.lm_head = head.to(device, dtype).requires_grad_(False)
        self.model = types.SimpleNamespace(embed_tokens=self.embed_tokens)


# ---- checkpoints ------------------------------------------------------------------------------

def _checkpoint_dirs(work_dir: Path) -> list[tuple[int, Path]]:
    root = work_dir / CHECKPOINTS
    found = []
    for d in root.glob('step-*') if root.is_dir() else []:
        if d.is_dir() and (d / TRAIN_STATE).is_file() and d.name[5:].isdigit():
            found.append((int(d.name[5:]), d))
    return sorted(found)


def save_checkpoint(work_dir: Path, step: int, core: EagleDraftHead, optimizer,
                    cfg: TrainDraftConfig) -> Path:
    """step-<N>/: draft folder files + optimizer tensors (safetensors) + train_state.json."""
    from safetensors.torch import save_file
    final = work_dir / CHECKPOINTS / f'step-{step:07d}'
    tmp = final.with_name(final.name + '.tmp')
    shutil.rmtree(tmp, ignore_errors=True)
    save_draft(core, tmp)
    state = optimizer.state_dict()
    tensors = {f'state.{idx}.{name}': value.detach().to('cpu').contiguous()
               for idx, entry in state['state'].items() for name, value in entry.items()}
    save_file(tensors, str(tmp / OPTIMIZER_FILE))
    groups = [{k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()}
              for g in state['param_groups']]
    (tmp / TRAIN_STATE).write_text(json.dumps(
        {'step': step, 'param_groups': groups, 'config': dataclasses.asdict(cfg)}, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    for _, old in _checkpoint_dirs(work_dir)[:-cfg.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(folder: Path, verifier_view, core: EagleDraftHead, optimizer) -> int:
    """Restore head weights and optimizer state; returns the step to continue from."""
    from safetensors.torch import load_file
    loaded = load_draft(folder, verifier_view, core.fc.weight.dtype, core.fc.weight.device)
    core.load_state_dict(loaded.state_dict())
    meta = json.loads((folder / TRAIN_STATE).read_text())
    state: dict[int, dict] = {}
    for key, value in load_file(str(folder / OPTIMIZER_FILE)).items():
        _, idx, name = key.split('.', 2)
        state.setdefault(int(idx), {})[name] = value
    groups = [{k: (tuple(v) if k == 'betas' else v) for k, v in g.items()}
              for g in meta['param_groups']]
    optimizer.load_state_dict({'state': state, 'param_groups': groups})
    return int(meta['step'])


# ---- command line -----------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument('--model', required=True, help='verifier checkpoint folder or preset name')
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument('--data',
                        help='observations: a .npz (images (N,H,W,3) uint8, instructions (N,) '
                        'str), a folder of such .npz files, or a folder of *.png/*.jpg images '
                        'with instructions.jsonl ({"image": ..., "instruction": ...} per line) '
                        'or instructions.txt (one instruction for all images)')
    source.add_argument('--bag', help='observations from a ROS 2 bag (directory, or its .mcap / '
                        '.db3 file): each frame of --image-topic paired with the latest '
                        '--instruction-topic message at or before it')
    p.add_argument('--image-topic', default=None, help='with --bag: sensor_msgs/Image or '
                   f'CompressedImage topic (default {DEFAULT_IMAGE_TOPIC})')
    p.add_argument('--instruction-topic', default=None, help='with --bag: std_msgs/String '
                   f'topic (default {DEFAULT_INSTRUCTION_TOPIC})')
    p.add_argument('--every-nth', type=int, default=None,
                   help='with --bag: keep every n-th paired frame (default 1)')
    p.add_argument('--out', required=True, help='draft folder to write (config.json + '
                   'model.safetensors): a new folder or a draft head\'s (retrained in place), '
                   'never a model checkpoint; <checkpoint>/draft is found automatically')
    p.add_argument('--force', action='store_true', help='write --out even where it holds a '
                   'model checkpoint or other weights (they are overwritten)')
    p.add_argument('--work-dir', default=None, help='data and checkpoints (default <out>/train)')
    defaults = TrainDraftConfig()
    for field in dataclasses.fields(TrainDraftConfig):
        p.add_argument('--' + field.name.replace('_', '-'), type=type(field.default),
                       default=getattr(defaults, field.name))
    p.add_argument('--resume', action='store_true', help='continue from the newest checkpoint')
    p.add_argument('--init-from', default=None, help='start from an existing draft folder')
    p.add_argument('--device', default='cpu', help='cpu or cuda (cuda:<LOCAL_RANK> under '
                   'torchrun)')
    p.add_argument('--dtype', default='float32', choices=['float32', 'float64', 'bfloat16',
                                                          'float16'],
                   help='verifier dtype for data generation (the head trains in float32)')
    p.add_argument('--center-crop', action='store_true', help='as at inference')
    p.add_argument('--rotate-180', action='store_true', help='as at inference')
    p.add_argument('--restrict-to-action-tokens', action='store_true', help='as at inference')
    p.add_argument('--max-samples', type=at_least(1), default=None,
                   help='use at most this many observations (default: all)')
    p.add_argument('--regenerate-data', action='store_true')
    p.add_argument('--no-progress', action='store_true')


def _source_settings(args: argparse.Namespace) -> dict:
    """Where the observations come from, as stored in the data manifest (data generated from
    other settings is regenerated). Fills the --bag options' defaults; refuses them without
    --bag."""
    bag_options = ('image_topic', 'instruction_topic', 'every_nth')
    args.bag = getattr(args, 'bag', None)       # Namespaces built by hand may lack it
    if args.bag is None:
        given = [name for name in bag_options if getattr(args, name, None) is not None]
        if given:
            raise ValueError(f'--{given[0].replace("_", "-")}: only applies with --bag')
        return {'data': str(Path(args.data).resolve())}
    args.image_topic = args.image_topic or DEFAULT_IMAGE_TOPIC
    args.instruction_topic = args.instruction_topic or DEFAULT_INSTRUCTION_TOPIC
    args.every_nth = 1 if args.every_nth is None else args.every_nth
    return {'bag': str(Path(args.bag).resolve()), 'image_topic': args.image_topic,
            'instruction_topic': args.instruction_topic, 'every_nth': args.every_nth}


def _dist_env() -> tuple[int, int, int]:
    world = int(os.environ.get('WORLD_SIZE', '1'))
    return int(os.environ.get('RANK', '0')), int(os.environ.get('LOCAL_RANK', '0')), world


def run(args: argparse.Namespace) -> int:
    summary = train_from_args(args)
    if summary['is_main']:
        print(json.dumps({k: v for k, v in summary.items() if k != 'is_main'}, indent=2))
    return 0


def train_from_args(args: argparse.Namespace) -> dict:
    import torch.distributed as dist
    rank, local_rank, world_size = _dist_env()
    device = parse_device('--device', args.device)
    if device.type == 'cuda':
        device = torch.device('cuda', local_rank if world_size > 1 else (device.index or 0))
        torch.cuda.set_device(device)
    if world_size > 1:
        dist.init_process_group('nccl' if device.type == 'cuda' else 'gloo')
    try:
        return _train(args, rank, world_size, device)
    finally:
        if world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _barrier(world_size: int) -> None:
    if world_size > 1:
        torch.distributed.barrier()


def _generate(args, loaded, engine_cfg, data_dir: Path, rank: int, world_size: int,
              progress: bool) -> None:
    from ..engine.device.runner import ModelRunner
    if args.bag is not None:
        from .bag_frames import load_bag_observations
        observations = load_bag_observations(args.bag, args.image_topic,
                                             args.instruction_topic, every_nth=args.every_nth,
                                             max_frames=args.max_samples)
    else:
        observations = load_observations(args.data)
    if args.max_samples is not None:
        observations = observations.limit(args.max_samples)
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, engine_cfg,
                         codec=loaded.codec)
    generate_shards(runner, engine_cfg, observations, data_dir, rank=rank,
                    world_size=world_size, progress=progress)


def _train(args, rank: int, world_size: int, device: torch.device) -> dict:
    from tqdm import tqdm

    from ..config import EngineConfig
    from ..engine.device.runner import TORCH_DTYPES
    from ..models import registry
    from ..policy import resolve_checkpoint
    cfg = TrainDraftConfig(**{f.name: getattr(args, f.name)
                              for f in dataclasses.fields(TrainDraftConfig)})
    source = _source_settings(args)
    is_main = rank == 0
    progress = is_main and not args.no_progress
    out = Path(args.out)
    work_dir = Path(args.work_dir) if args.work_dir else out / 'train'
    data_dir = work_dir / 'data'

    # 1. The verifier, exactly as inference will run it (preprocessing, greedy rule).
    folder = resolve_checkpoint(args.model)
    check_draft_out(out, folder, getattr(args, 'force', False))   # before minutes of work
    engine_cfg = EngineConfig(device=str(device), dtype=args.dtype, center_crop=args.center_crop,
                              rotate_180=args.rotate_180,
                              restrict_to_action_tokens=args.restrict_to_action_tokens)
    loaded = registry.load(folder, TORCH_DTYPES[args.dtype], str(device),
                           engine_cfg.max_instruction_tokens)
    model, vla_cfg = loaded.model, loaded.cfg
    # 2. Training data: generated once per settings, each rank doing its share.
    settings = {'model': str(folder.resolve()), **source,
                'dtype': args.dtype, 'center_crop': args.center_crop,
                'rotate_180': args.rotate_180, 'max_samples': args.max_samples,
                'restrict_to_action_tokens': args.restrict_to_action_tokens}
    manifest = read_manifest(data_dir)
    if args.regenerate_data or manifest is None or manifest['settings'] != settings:
        _barrier(world_size)        # every rank has read the old manifest
        if is_main and (data_dir / 'manifest.json').exists():
            (data_dir / 'manifest.json').unlink()
        _generate(args, loaded, engine_cfg, data_dir, rank, world_size, progress)
        _barrier(world_size)
        if is_main:
            write_manifest(data_dir, settings)
        _barrier(world_size)
    data = DraftDataset(data_dir)
    if len(data) == 0:
        raise ValueError(f'{data_dir}: no samples')

    # 3. The head (float32) over frozen float32 copies of the verifier's embedding / lm_head.
    verifier_view = FrozenVerifierHead(model.language_model, torch.float32, device)
    del model
    if args.init_from:
        core = load_draft(args.init_from, verifier_view, torch.float32, device)
    else:
        core = new_draft_head(verifier_view, DraftConfig.from_verifier(vla_cfg.llm),
                              seed=cfg.seed, dtype=torch.float32, device=device)
    core.train()
    head: nn.Module = core
    if world_size > 1:
        from torch.nn.parallel import DistributedDataParallel
        head = DistributedDataParallel(core, device_ids=[device.index]
                                       if device.type == 'cuda' else None)
    optimizer = torch.optim.AdamW(core.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                  weight_decay=cfg.weight_decay)
    start = 0
    if args.resume:
        found = _checkpoint_dirs(work_dir)
        if found:
            start = load_checkpoint(found[-1][1], verifier_view, core, optimizer)
            if is_main:
                print(f'resuming from {found[-1][1]} (step {start})', file=sys.stderr)
        elif is_main:
            print(f'no checkpoint in {work_dir / CHECKPOINTS}; starting at step 0',
                  file=sys.stderr)

    # 4. The loop: deterministic batches and noise per (step, rank), so resuming is exact.
    first: dict = {}
    last: dict = {}
    bar = tqdm(total=cfg.steps, initial=start, desc='train-draft', disable=not progress)
    for step in range(start, cfg.steps):
        for group in optimizer.param_groups:
            group['lr'] = lr_at(step, cfg)
        ids = batch_indices(step, len(data), cfg.batch_size, rank, world_size, cfg.seed)
        packed = pack_samples([data[i] for i in ids], core.embed, device, torch.float32)
        noise_gen = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 4099 + rank)
        loss, last = draft_loss(head, core, packed, cfg, noise_gen)
        first = first or last
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(core.parameters(), cfg.grad_clip)
        check_finite_step(step + 1, last['loss'], grad_norm)
        optimizer.step()
        bar.update(1)
        if (step + 1) % cfg.log_every == 0:
            bar.set_postfix(loss=f'{last["loss"]:.4f}', top1=f'{last["top1"]:.3f}')
            if is_main and not progress:
                print(f'step {step + 1}/{cfg.steps} loss {last["loss"]:.4f} v_loss '
                      f'{last["v_loss"]:.4f} p_loss {last["p_loss"]:.4f} top1 '
                      f'{last["top1"]:.3f}', file=sys.stderr)
        if is_main and ((step + 1) % cfg.save_every == 0 or step + 1 == cfg.steps):
            save_checkpoint(work_dir, step + 1, core, optimizer, cfg)
    bar.close()

    # 5. The final head, and its agreement with the verifier on the training positions.
    core.eval()
    summary = {'is_main': is_main, 'out': str(out), 'steps': cfg.steps, 'start_step': start,
               'num_samples': len(data), 'world_size': world_size, 'first_batch': first,
               'last_batch': last}
    if is_main:
        save_draft(core, out)
        summary['train_top1_agreement'] = evaluate_agreement(core, data, device)
    _barrier(world_size)
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='vla-spec train-draft', description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return parser


def main(argv=None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == '__main__':
    sys.exit(main())
