"""What an idle gap before a frame costs on this machine, model only.

A camera at 30 Hz leaves the inference thread idle between frames (the FAST model's default
decides a frame in about a third of a period). This script measures what that idleness costs
the next frame:

1. One small operation (a (16, 96) torch add, a numpy add, a (16, 96) @ (96, 96) product),
   timed right after the previous one and after a pause of each --gaps ms, the pause slept
   (the thread blocks: the CPU may go idle) or spun (the thread keeps it busy). p50 in us.
2. The model's frames (--rows, AR first), one robot's consecutive control steps submitted back
   to back and then one every 1 / --rate s (bench/frame_runs.py), interleaved over --rounds:
   the frame's p50 ms, and each row's p50 against AR's at the same pacing.

Part 1 tells the machine's idle penalty apart from the model's: when a 1 us operation costs
hundreds of us after a slept pause, the cost is the machine's (a virtual CPU given back to its
host while idle, its caches and predictors cold when it returns), and it falls on the frame's
fixed costs (vision, prefill) that AR and the default pay alike.

    python3 bench/idle_penalty.py --model metaworld-demo-fast --rows ar,pipeline_spec \
        --seed 2000 --out bench/results/idle_penalty
"""
from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

REPEATS = 60            # timings per operation and pause


def pause(seconds: float, how: str) -> None:
    if how == 'sleep':
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def op_after_pause(op, seconds: float, how: str, repeats: int | None = None) -> float:
    """p50 us of `op` run right after a pause of `seconds` (`how`: sleep or spin), over
    `repeats` runs (default REPEATS)."""
    times = []
    for _ in range(REPEATS if repeats is None else repeats):
        if seconds > 0:
            pause(seconds, how)
        start = time.perf_counter()
        op()
        times.append(1e6 * (time.perf_counter() - start))
    return statistics.median(times)


def small_operations():
    import numpy as np
    import torch
    x, w = torch.randn(16, 96), torch.randn(96, 96)
    a = np.random.default_rng(0).standard_normal((16, 96))
    return {'torch add (16, 96)': lambda: x + x, 'numpy add (16, 96)': lambda: a + a,
            'torch (16, 96) @ (96, 96)': lambda: x @ w}


def part_one(gaps_ms) -> list[str]:
    # a zero pause once (no pause to sleep or spin), every other pause slept and spun
    columns = [(g, how) for g in gaps_ms for how in ('sleep', 'spin') if g or how == 'sleep']
    lines = ['## 1. One small operation after a pause (p50 us)', '',
             '| operation | ' + ' | '.join(f'{g:g} ms {how}' for g, how in columns) + ' |',
             '|---' * (1 + len(columns)) + '|']
    for name, op in small_operations().items():
        op_after_pause(op, 0.0, 'sleep')             # warm
        cells = [op_after_pause(op, g / 1e3, how) for g, how in columns]
        lines.append(f'| {name} | ' + ' | '.join(f'{c:.1f}' for c in cells) + ' |')
    return lines


def part_two(model: str, rows: dict, frames_wanted: int, rate: float, rounds: int,
             seed: int) -> tuple[list[str], dict]:
    from frame_runs import WARMUP_FRAMES, run_frames   # bench/, beside this script

    from vla_spec_ros.harness import streaming
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    policies = {label: VLAPolicy.from_pretrained(model, **options)
                for label, options in rows.items()}
    baseline = next(iter(policies))
    unnorm_key = _resolve_unnorm_key(policies[baseline], None)
    frames = streaming.stream_frames(list(DEFAULT_TASK_NAMES), WARMUP_FRAMES + frames_wanted,
                                     policies[baseline].model_config.image_size, seed,
                                     unnorm_key)
    pacings = {'back to back': 0.0, f'{rate:g} Hz': 1.0 / rate}
    ms = {(label, pacing): [] for label in policies for pacing in pacings}
    for _ in range(rounds):
        for pacing, period in pacings.items():
            for label, policy in policies.items():
                ms[label, pacing] += [m for m, _, _ in run_frames(policy, frames, unnorm_key,
                                                                  period)]
    p50 = {key: statistics.median(values) for key, values in ms.items()}
    lines = [f'## 2. The model\'s frames, back to back and at {rate:g} Hz (p50 ms; x '
             f'{baseline} at the same pacing)', '',
             '| row | ' + ' | '.join(pacings) + ' | paced / back to back |',
             '|---' * (len(pacings) + 2) + '|']
    paced = f'{rate:g} Hz'
    for label in policies:
        cells = [f'{p50[label, pacing]:.2f} (x{p50[label, pacing] / p50[baseline, pacing]:.2f})'
                 for pacing in pacings]
        lines.append(f'| {label} | ' + ' | '.join(cells) +
                     f' | {p50[label, paced] / p50[label, "back to back"]:.2f} |')
    return lines, {f'{label} | {pacing}': value for (label, pacing), value in p50.items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo-fast')
    parser.add_argument('--rows', default='ar,pipeline_spec',
                        help='comma-separated: a mode, or label=mode:option=value:...; the '
                             'first row is the baseline')
    parser.add_argument('--gaps', default='5,20,33', help='pauses of part 1, ms')
    parser.add_argument('--rate', type=float, default=30.0)
    parser.add_argument('--frames', type=int, default=200)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--seed', type=int, default=2000,
                        help='episode seeds of the frames (2000: validation placements)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--skip-model', action='store_true', help='part 1 only')
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    if args.frames < 1 or args.rounds < 1 or args.rate <= 0:
        parser.error('--frames and --rounds must be >= 1 and --rate > 0')
    try:
        gaps_ms = [0.0] + [float(g) for g in args.gaps.split(',') if float(g) > 0]
    except ValueError:
        parser.error(f'--gaps: expected comma-separated milliseconds, got {args.gaps!r}')

    import torch

    from records import parse_row, write_record      # bench/, beside this script

    torch.set_num_threads(args.threads)
    command = 'python3 bench/idle_penalty.py ' + ' '.join(
        sys.argv[1:] if argv is None else argv)
    report = [f'# What an idle gap before a frame costs ({time.strftime("%Y-%m-%d %H:%M:%S")})',
              '', f'command: `{command}`', '']
    report += part_one(gaps_ms) + ['']
    data = {'command': command}
    if not args.skip_model:
        rows = dict(parse_row(text) for text in args.rows.split(','))
        lines, data['frame_p50_ms'] = part_two(args.model, rows, args.frames, args.rate,
                                               args.rounds, args.seed)
        report += lines
    text = '\n'.join(report)
    print(text)
    if args.out:
        write_record(args.out, 'idle_penalty', text, data)


if __name__ == '__main__':
    main()
