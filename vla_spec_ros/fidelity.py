"""``vla-spec fidelity``: how far a run is from a reference run, stage by stage, on real frames.

For a checkpoint and a set of frames (image files, or held-out Meta-World observations):

- **pixels**: the uint8 S x S image the engine feeds the towers, taken through the engine's
  own path on each device (``FrameUploader`` then the model's ``preprocess``), against the
  family's reference processor written out on its own (OpenVLA's: Pillow's ``resize(...,
  BICUBIC)``, after the evaluation code's crop when ``--center-crop``): the largest difference
  in uint8 levels, the share of values and the frames that differ. For contrast, the same for
  the one-pass antialiased float64 bicubic this project resized with before.
- **normalised pixels and the vision stages** (OpenVLA: the towers' concatenated features,
  the projector's output): each run (device, dtype) against the reference run (float64 on the
  CPU unless ``--reference``): the largest absolute error of the normalised pixels, and per
  frame the relative error ||run - ref|| / ||ref|| of each stage (median and largest).
- **action tokens**: the run's greedy tokens against the reference's (``--mode``, AR by
  default): frames whose tokens all agree, and per token the distance in bins (adjacent action
  tokens are adjacent bins) as 0, 1, 2 and 3+, over all tokens and per action dimension. A
  token outside the action range counts as 3+ unless both runs produced it.

The family's part (its reference processor, its vision stages, its image size from config.json)
comes from its registry entry's ``fidelity`` hooks (models/family.py, FidelityHooks); a family
without them is refused, naming it.
"""
from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from .config import DTYPES
from .devices import parse_device
from .engine.device.frame_upload import FrameUploader
from .validation import at_least
from .engine.result import Frame
from .models import registry

BUCKETS = ('0', '1', '2', '3+')
IMAGE_SUFFIXES = ('.png', '.jpg', '.jpeg')


# ---- frames ----------------------------------------------------------------------------------

def folder_frames(folder: str, instruction: str, limit: int | None,
                  unnorm_key: str | None) -> list[Frame]:
    """The png / jpg files of a folder in name order, as RGB frames (Pillow decodes them, as
    OpenVLA's examples do), all with one instruction."""
    paths = sorted(p for p in Path(folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise ValueError(f'--images: no {"/".join(IMAGE_SUFFIXES)} files in {folder}')
    return [Frame(_read_rgb(path), instruction, unnorm_key) for path in paths[:limit]]


def _read_rgb(path: Path) -> np.ndarray:
    """One image file as RGB; ValueError naming it when Pillow cannot decode it (a corrupt
    or truncated file, or another format under an image suffix)."""
    try:
        with Image.open(path) as image:
            return np.array(image.convert('RGB'))
    except (OSError, SyntaxError, ValueError) as exc:     # UnidentifiedImageError: OSError
        raise ValueError(f'--images: cannot decode {path} ({exc})') from exc


# ---- pixels ----------------------------------------------------------------------------------

def one_pass_pixels(image: np.ndarray, size: int, rotate_180: bool = False) -> np.ndarray:
    """The resize this project used before: one antialiased float64 bicubic pass, rounded
    once (no crop)."""
    if rotate_180:
        image = image[::-1, ::-1]
    x = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).to(torch.float64)
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x[None], size=(size, size), mode='bicubic', antialias=True,
                          align_corners=False)[0]
    return x.round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def pixel_stats(ours: list, reference: list) -> dict:
    diffs = [np.abs(a.astype(np.int16) - b.astype(np.int16)) for a, b in zip(ours, reference)]
    values = sum(d.size for d in diffs)
    return {'max_levels': int(max(d.max() for d in diffs)),
            'values_differing': sum(int((d > 0).sum()) for d in diffs) / max(values, 1),
            'frames_differing': sum(bool(d.any()) for d in diffs), 'frames': len(diffs)}


# ---- tokens ----------------------------------------------------------------------------------

def bin_histogram(ours: list, reference: list, first_action_id: int,
                  last_action_id: int) -> dict:
    """Per-token bin distance of two runs' token tuples (frame by frame): counts over all
    tokens and per action dimension, and the frames whose tokens all agree."""
    dims = max((len(t) for t in reference), default=0)
    total = dict.fromkeys(BUCKETS, 0)
    per_dim = [dict.fromkeys(BUCKETS, 0) for _ in range(dims)]
    frames_exact = 0
    for got, want in zip(ours, reference):
        frames_exact += tuple(got) == tuple(want)
        for d, (a, b) in enumerate(zip(got, want)):
            in_range = all(first_action_id <= t <= last_action_id for t in (a, b))
            bucket = BUCKETS[min(abs(int(a) - int(b)) if in_range or a == b else 3, 3)]
            total[bucket] += 1
            per_dim[d][bucket] += 1
    return {'total': total, 'per_dim': per_dim, 'frames_exact': frames_exact,
            'frames': len(reference)}


# ---- runs ------------------------------------------------------------------------------------

def fidelity_hooks(cfg):
    """The fidelity hooks of the family whose config ``cfg`` is (ValueError naming it when it
    has none)."""
    family = registry.family_of_config(cfg)
    if family.fidelity is None:
        raise ValueError(f'--model: the {family.name} family has no fidelity stages')
    return family.fidelity()


def _run_stages(policy, frames: list[Frame], center_crop: bool, rotate_180: bool,
                unnorm_key: str) -> dict:
    """Normalised pixels, the family's vision stages (float64 on the CPU) and tokens of every
    frame, each stage through the engine's own path."""
    runner, config = policy.engine.runner, policy.config
    hooks = fidelity_hooks(runner.cfg)
    out = {'pixels': [], 'tokens': []}
    with torch.inference_mode():
        for frame in frames:
            pixels = runner.prepare_pixels(frame, config)          # (1, C, S, S): one image
            for name, value in (('pixels', pixels), *hooks.stages(runner.model, pixels).items()):
                out.setdefault(name, []).append(value[0].to('cpu', torch.float64))
    for frame in frames:
        out['tokens'].append(tuple(policy.predict(frame.image, frame.instruction,
                                                  unnorm_key).tokens))
    return out


def _relative(run: list, ref: list) -> dict:
    errors = [float((a - b).norm() / b.norm().clamp_min(1e-30)) for a, b in zip(run, ref)]
    return {'median': float(np.median(errors)), 'max': float(np.max(errors))}


def measure(model: str, frames: list[Frame], dtypes, devices, reference: str = 'float64',
            mode: str = 'ar', center_crop: bool = False, rotate_180: bool = False,
            unnorm_key: str | None = None) -> dict:
    from .policy import VLAPolicy
    options = {'mode': mode, 'center_crop': center_crop, 'rotate_180': rotate_180}
    ref_policy = VLAPolicy.from_pretrained(model, device='cpu', dtype=reference, **options)
    cfg, ref_model = ref_policy.model_config, ref_policy.engine.runner.model
    hooks = fidelity_hooks(cfg)
    size = cfg.image_size
    key = unnorm_key or ref_policy.unnorm_keys[0]
    images = [f.image for f in frames]

    expected = [hooks.reference_pixels(im, size, center_crop, rotate_180) for im in images]
    pixels = {}
    for device in devices:
        uploader = FrameUploader(device)
        ours = [hooks.levels(ref_model.preprocess(uploader.upload(im), center_crop=center_crop,
                                                  rotate_180=rotate_180), cfg)
                for im in images]
        pixels[f'engine path, {device}'] = pixel_stats(ours, expected)
    if not center_crop:
        pixels['one-pass float64 bicubic (before)'] = pixel_stats(
            [one_pass_pixels(im, size, rotate_180) for im in images], expected)

    ref = _run_stages(ref_policy, frames, center_crop, rotate_180, key)
    stage_names = [name for name in ref if name not in ('pixels', 'tokens')]
    at = ref_policy.engine.runner.codec
    runs = []
    for device in devices:
        for dtype in dtypes:
            policy = ref_policy if (device, dtype) == ('cpu', reference) else \
                VLAPolicy.from_pretrained(model, device=device, dtype=dtype, **options)
            got = _run_stages(policy, frames, center_crop, rotate_180, key)
            runs.append({
                'device': device, 'dtype': dtype,
                'pixels_max_abs': max(float((a - b).abs().max())
                                      for a, b in zip(got['pixels'], ref['pixels'])),
                **{name: _relative(got[name], ref[name]) for name in stage_names},
                'tokens': bin_histogram(got['tokens'], ref['tokens'], at.first_action_id,
                                        at.last_action_id)})
    return {'model': model, 'image_size': size, 'frames': len(frames), 'stages': stage_names,
            'frame_sizes': sorted({f'{im.shape[1]}x{im.shape[0]}' for im in images}),
            'reference': f'cpu {reference}', 'mode': mode, 'center_crop': center_crop,
            'rotate_180': rotate_180, 'unnorm_key': key, 'pixels': pixels, 'runs': runs}


# ---- report ----------------------------------------------------------------------------------

def _share(count: int, total: int) -> str:
    return f'{100.0 * count / max(total, 1):.2f} %'


def format_report(result: dict) -> str:
    size = result['image_size']
    lines = [f'model {result["model"]}, {result["frames"]} frames '
             f'({", ".join(result["frame_sizes"])}) -> {size}x{size}, reference '
             f'{result["reference"]}, mode {result["mode"]}, center_crop '
             f'{result["center_crop"]}, rotate_180 {result["rotate_180"]}',
             '', "Pixels: uint8 levels against OpenVLA's processor (Pillow BICUBIC)", '',
             '| path | max level diff | values differing | frames differing |',
             '|---|---|---|---|']
    for name, p in result['pixels'].items():
        lines.append(f'| {name} | {p["max_levels"]} | {100 * p["values_differing"]:.2f} % | '
                     f'{p["frames_differing"]} / {p["frames"]} |')
    stages = result['stages']
    lines += ['', f'Against the reference ({result["reference"]}): normalised pixels (max abs '
              'error), relative error of each vision stage (median / max over frames), action '
              'tokens (bin distance)', '',
              '| run | pixels | ' + ' | '.join(stages) + ' | frames exact | 0 bins | 1 bin '
              '| 2 bins | 3+ bins |', '|---|---|' + '---|' * len(stages) + '---|---|---|---|---|']
    for r in result['runs']:
        t = r['tokens']
        n = sum(t['total'].values())
        lines.append(f'| {r["device"]} {r["dtype"]} | {r["pixels_max_abs"]:.2e} | '
                     + ''.join(f'{r[s]["median"]:.2e} / {r[s]["max"]:.2e} | ' for s in stages)
                     + f'{t["frames_exact"]} / {t["frames"]} | '
                     + ' | '.join(_share(t['total'][b], n) for b in BUCKETS) + ' |')
    runs = result['runs']
    lines += ['', 'Bin distance per action dimension: tokens at 0 / 1 / 2 / 3+ bins from the '
              'reference', '', '| dim | ' + ' | '.join(f'{r["device"]} {r["dtype"]}'
                                                       for r in runs) + ' |',
              '|---|' + '---|' * len(runs)]
    for d in range(len(runs[0]['tokens']['per_dim']) if runs else 0):
        lines.append(f'| {d} | ' + ' | '.join(
            ' / '.join(str(r['tokens']['per_dim'][d][b]) for b in BUCKETS) for r in runs)
            + ' |')
    return '\n'.join(lines)


def environment() -> dict:
    return {'python': platform.python_version(), 'torch': torch.__version__,
            'pillow': Image.__version__, 'machine': platform.machine(),
            'processor': platform.processor() or platform.machine(),
            'threads': torch.get_num_threads(),
            'cuda': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


# ---- command ---------------------------------------------------------------------------------

def add_arguments(p) -> None:
    p.add_argument('--model', default='metaworld-demo',
                   help='checkpoint folder, embedded model or preset name')
    p.add_argument('--images', default=None, help='folder of png / jpg frames')
    p.add_argument('--frames-from', default='metaworld', choices=('metaworld',),
                   help='without --images: held-out Meta-World observations of the embedded '
                   'model\'s tasks (needs the simulator)')
    p.add_argument('--frames', type=at_least(1), default=200, help='frames to use (at most)')
    p.add_argument('--frame-size', type=at_least(1), default=None,
                   help='side of the rendered Meta-World frames (default: the model\'s image '
                   'size; another size takes the resize path)')
    p.add_argument('--instruction', default='open the drawer', help='with --images')
    p.add_argument('--unnorm-key', default=None)
    p.add_argument('--dtypes', default='float32,bfloat16')
    p.add_argument('--reference', default='float64', choices=('float64', 'float32'))
    p.add_argument('--devices', default=None,
                   help='comma-separated (default: cpu, and cuda when a GPU is present)')
    p.add_argument('--mode', default='ar')
    p.add_argument('--center-crop', action='store_true')
    p.add_argument('--rotate-180', action='store_true')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=None, help='write README.md (command, machine, tables) '
                   'and fidelity.json here')


def _dtypes(text: str) -> list[str]:
    """--dtypes as a list: at least one, each an engine dtype (checked before the reference
    run, which takes minutes on a real model)."""
    dtypes = [d.strip() for d in text.split(',') if d.strip()]
    if not dtypes:
        raise ValueError(f'--dtypes: no dtype given ({text!r}); choose from {list(DTYPES)}')
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f'--dtypes: unknown {unknown}; choose from {list(DTYPES)}')
    return dtypes


def run(args) -> int:
    import shlex
    from .policy import resolve_checkpoint
    dtypes = _dtypes(args.dtypes)
    devices = [d.strip() for d in args.devices.split(',') if d.strip()] if args.devices else \
        ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    for device in devices:       # before any frame is made or model loaded
        parse_device('--devices', device)
    if args.images:
        frames = folder_frames(args.images, args.instruction, args.frames, args.unnorm_key)
    else:
        from .sim.frames import benchmark_frames
        folder = resolve_checkpoint(args.model)
        raw = json.loads((folder / 'config.json').read_text())
        family = registry.detect(raw)
        if family.fidelity is None:
            raise ValueError(f'--model: the {family.name} family has no fidelity stages')
        size = args.frame_size if args.frame_size is not None else \
            family.fidelity().image_size(raw)
        frames = benchmark_frames(args.frames, size, args.seed, args.unnorm_key)
    result = measure(args.model, frames, dtypes, devices, args.reference, args.mode,
                     args.center_crop, args.rotate_180, args.unnorm_key)
    report = format_report(result)
    print(report)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        command = 'vla-spec ' + ' '.join(shlex.quote(a) for a in args.argv)
        env = environment()
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')
        (out / 'README.md').write_text(
            f'# Fidelity: {result["model"]}\n\n`{command}`\n\n{stamp}; {env["processor"]}, '
            f'{env["threads"]} threads, GPU {env["cuda"]}; Python {env["python"]}, torch '
            f'{env["torch"]}, Pillow {env["pillow"]}\n\n{report}\n')
        (out / 'fidelity.json').write_text(json.dumps(
            {'command': command, 'date': stamp, 'environment': env, **result}, indent=1))
    return 0
