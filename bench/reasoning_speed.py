"""A reasoning policy's consecutive control steps: AR, the default mode (lookup drafting from
the previous output) and the transformers baseline, in one run.

    python3 bench/reasoning_speed.py [--frames 24] [--warmup 3] [--rounds 3] [--budget 200]
        [--drift 3] [--modes ar,spec,pipeline_spec] [--model NAME] [--seed 0]
        [--every-n 2,4] [--threads N] [--out DIR]

``--model``: a trained reasoning checkpoint (the embedded ``metaworld-demo-reason``, or a
folder) on consecutive control steps of the scripted expert's Meta-World episodes
(``sim.frames.episode_frames``: held-out placements, every task in turn, one camera) instead
of the two random-weight models below. ``--every-n``: the default mode again with
``reasoning_every_n`` N (the lossy reuse, docs/reasoning.md), one row per N.

Models (random weights, ECoT's layout: models/ecot/): ``ecot-tiny --scripted-reasoning``
(about 40 tokens of reasoning, ``ACTION:``, 7 bins: the text repeats from step to step) and
``ecot-tiny`` with random weights and a ``--budget`` of text (no action: every frame runs out
its budget, and how much of a step's text repeats the last one's is whatever the random
weights make of the drift). Frames: one robot's camera, one scene drifting by +-``--drift``
grey levels per step. Per model and mode, through ``bench.bench_engine`` (the saturating
one-camera loop), in ``--rounds`` interleaved rounds (medians): verifier forwards per step,
tokens per step, steps/s, latency p50, ratios against AR and HF measured in the same round;
and, for the scripted model, tokens accepted per verifier forward by reasoning field (each
forward's emitted tokens attributed to the field they fall in). Writes
``reasoning_speed-<stamp>.{json,md}`` under ``--out`` with the command.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vla_spec_ros import VLAPolicy  # noqa: E402
from vla_spec_ros.baseline import make_baseline  # noqa: E402
from vla_spec_ros.bench import bench_engine, bench_hf, environment  # noqa: E402
from vla_spec_ros.engine.result import Frame  # noqa: E402
from vla_spec_ros.models import registry  # noqa: E402

OUT = ROOT / 'bench' / 'results' / 'reasoning'
INSTRUCTION = 'put the cup on the plate'


def drifting_frames(num: int, drift: int, seed: int = 0) -> list[Frame]:
    rng = np.random.default_rng(seed)
    scene = rng.integers(0, 256, (48, 64, 3)).astype(int)
    frames = []
    for _ in range(num):
        scene = np.clip(scene + rng.integers(-drift, drift + 1, scene.shape), 0, 255)
        frames.append(Frame(scene.astype(np.uint8), INSTRUCTION, 'bridge_orig', 'robot'))
    return frames


def field_acceptance(policy, frames) -> dict:
    """Tokens emitted per verifier forward, by the reasoning field they fall in (the field of
    a forward's first token), over ``frames`` in the default mode."""
    from vla_spec_ros.models.ecot.reasoning_text import FIELD_NAMES
    engine, codec = policy.engine, policy.engine.runner.codec
    prompt = engine.runner.tokenizer
    per_field: dict[str, list[int]] = {}
    for frame in frames:
        engine.submit(dataclasses.replace(frame))
        for fin in engine.run_until_idle():
            tokens, position = fin.result.tokens, 0
            marker_at = len(codec.split(tokens).reasoning)
            for emitted in fin.result.stats['accepted_lengths']:
                if position >= marker_at:
                    name = 'action'
                else:
                    text = 'TASK: ' + prompt.decode(tokens[:position + 1])
                    tags = [(text.rfind(t), n) for t, n in FIELD_NAMES.items()]
                    name = max(tags)[1] if max(tags)[0] >= 0 else 'task'
                per_field.setdefault(name, []).append(emitted)
                position += emitted
    return {name: round(float(np.mean(v)), 2) for name, v in per_field.items()}


def _trained_model(args):
    """(models, frames) for ``--model``: the checkpoint and the episodes' frames."""
    from vla_spec_ros.sim.frames import episode_frames
    policy = VLAPolicy.from_pretrained(args.model, mode='ar')
    frames = episode_frames(args.frames + args.warmup, policy.model_config.image_size,
                            args.seed, policy.unnorm_keys[0])
    return {args.model: (args.model, {})}, frames


def run(args) -> dict:
    if args.model:
        models, frames = _trained_model(args)
        return _run_models(args, models, frames, with_fields=True)
    tmp = Path(tempfile.mkdtemp(prefix='reasoning-bench-'))
    models = {
        'scripted': (registry.make_checkpoint('ecot-tiny', tmp / 'scripted', seed=0,
                                              scripted_reasoning=True), {}),
        f'random-{args.budget}': (registry.make_checkpoint('ecot-tiny', tmp / 'random', seed=0),
                                  {'max_reasoning_tokens': args.budget}),
    }
    frames = drifting_frames(args.frames + args.warmup, args.drift)
    return _run_models(args, models, frames, with_fields=False)


def _run_models(args, models: dict, frames, with_fields: bool) -> dict:
    rows = {}
    for name, (folder, options) in models.items():
        policies = {mode: VLAPolicy.from_pretrained(str(folder), mode=mode, **options)
                    for mode in args.modes}
        default_mode = 'pipeline_spec' if 'pipeline_spec' in args.modes else args.modes[-1]
        for n in args.every_n:        # the lossy option, on the default mode
            policies[f'{default_mode} every {n}'] = VLAPolicy.from_pretrained(
                str(folder), mode=default_mode, reasoning_every_n=n, **options)
        baseline = make_baseline(policies['ar'].engine.runner, policies['ar'].config)
        labels = list(policies)
        samples = {label: [] for label in [*labels, 'hf']}
        for _ in range(args.rounds):            # interleaved: each round runs every row once
            for mode in labels:
                engine = policies[mode].engine
                engine.reset()
                samples[mode].append(bench_engine(engine, frames, args.warmup))
            samples['hf'].append(bench_hf(baseline, frames, args.warmup))
        table = {}
        for label, runs in samples.items():
            table[label] = {
                'steps_per_s': statistics.median(r.actions_per_s for r in runs),
                'p50_ms': statistics.median(r.latency_p50_ms for r in runs),
                'forwards_per_step': statistics.median(r.forwards_per_action for r in runs),
                'tokens_per_step': statistics.median(r.tokens_per_action for r in runs)}
        for label, row in table.items():
            row['steps_per_s_vs_ar'] = row['steps_per_s'] / table['ar']['steps_per_s']
            row['steps_per_s_vs_hf'] = row['steps_per_s'] / table['hf']['steps_per_s']
            row['forwards_vs_ar'] = row['forwards_per_step'] / table['ar']['forwards_per_step']
            row['p50_vs_ar'] = row['p50_ms'] / table['ar']['p50_ms']
        default = 'pipeline_spec' if 'pipeline_spec' in args.modes else args.modes[-1]
        policies[default].engine.reset()
        fields = (field_acceptance(policies[default], frames)
                  if with_fields or name == 'scripted' else {})
        rows[name] = {'table': table, 'accepted_per_forward_by_field': fields}
    return rows


def markdown(rows: dict, record: dict) -> str:
    lines = [f'# Reasoning policy, consecutive steps ({record["stamp"]})', '',
             f'`{record["command"]}`', '', f'machine: {record["environment"]}', '']
    for name, result in rows.items():
        lines += [f'## {name}', '', '| mode | steps/s | x AR | x HF | forwards/step | '
                  'x AR | tokens/step | p50 ms | x AR |', '|---|---|---|---|---|---|---|---|---|']
        for label, r in result['table'].items():
            lines.append(f'| {label} | {r["steps_per_s"]:.2f} | {r["steps_per_s_vs_ar"]:.2f} | '
                         f'{r["steps_per_s_vs_hf"]:.2f} | {r["forwards_per_step"]:.1f} | '
                         f'{r["forwards_vs_ar"]:.3f} | {r["tokens_per_step"]:.1f} | '
                         f'{r["p50_ms"]:.1f} | {r["p50_vs_ar"]:.2f} |')
        if result['accepted_per_forward_by_field']:
            lines += ['', 'Tokens per verifier forward by field (default mode): ' + ', '.join(
                f'{k} {v}' for k, v in result['accepted_per_forward_by_field'].items())]
        lines.append('')
    return '\n'.join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--frames', type=int, default=24)
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument('--budget', type=int, default=200)
    parser.add_argument('--drift', type=int, default=3)
    parser.add_argument('--modes', default='ar,spec,pipeline_spec')
    parser.add_argument('--model', default='', help='a trained reasoning checkpoint on '
                        "Meta-World episodes' consecutive steps (module docstring)")
    parser.add_argument('--seed', type=int, default=0, help='--model: the frames\' seed')
    parser.add_argument('--every-n', default='', help='comma-separated reasoning_every_n '
                        'values: the default mode again with the lossy reuse (rows '
                        '"pipeline_spec every N")')
    parser.add_argument('--threads', type=int, default=None, help='torch CPU threads')
    parser.add_argument('--out', type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    args.modes = args.modes.split(',')
    args.every_n = [int(n) for n in args.every_n.split(',') if n]
    if 'ar' not in args.modes:
        parser.error('--modes: ar is the baseline every ratio needs')
    stamp = time.strftime('%Y%m%d-%H%M%S')
    record = {'stamp': stamp, 'environment': environment(),
              'command': 'python3 bench/reasoning_speed.py ' + shlex.join(argv or sys.argv[1:])}
    rows = run(args)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f'reasoning_speed-{stamp}.json').write_text(json.dumps(
        {**record, 'rows': rows}, indent=2))
    text = markdown(rows, record)
    (args.out / f'reasoning_speed-{stamp}.md').write_text(text)
    print(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
