"""Drafters compared at the camera's pace, model only: one robot's consecutive control steps
submitted one every 1 / --rate s (as a camera would, so every frame starts from an idle engine,
as it does behind the node), each row a mode with EngineConfig options, interleaved over
--rounds. Prints per row the frame's ms (p50, p90, p99, mean), its verifier forwards (mean, p50,
the share decided in one forward and in at most two), p50 against AR's and whether every
frame's tokens equal AR's.

The frame loop is bench/frame_runs.py (shared with draft_after_miss.py). Rows are written as in
bench/stream_tail.py: a mode, or label=mode:option=value:... One option is not the engine's:
`positional_drafts=true` continues the row's drafts by token position (the protocol's rule),
not by the codec's own continue_draft, to compare the two in one run. For an EAGLE
head trained on the scripted expert's frames (training placements, seed 0), first write the
observations, then train the head:

    python3 bench/paced_drafts.py --write-observations data/fast_obs.npz --frames 3000 --seed 0
    vla-spec train-draft --model metaworld-demo-fast --data data/fast_obs.npz \
        --out data/fast_head --steps 1500 --batch-size 16 --lr 3e-3 --warmup-steps 100 --seed 0
    python3 bench/paced_drafts.py --model metaworld-demo-fast --seed 2000 --rows \
        ar,pipeline_spec,head=pipeline_spec:draft_path=data/fast_head:draft_previous_action=true \
        --out bench/results/paced_drafts
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_observations(path: str, frames) -> None:
    """The frames as train-draft's observations: images (N, H, W, 3) uint8, instructions (N,)."""
    np.savez(path, images=np.stack([f.image for f in frames]),
             instructions=np.array([f.instruction for f in frames]))
    print(f'written {path}: {len(frames)} observations')


def load_row(model: str, options: dict):
    """The row's policy; with `positional_drafts` true its codec continues drafts by position
    (ActionCodec's rule) before its engine's drafters are built."""
    from vla_spec_ros.harness.speed import engine_for
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.testing import continue_drafts_by_position
    options = dict(options)
    positional = bool(options.pop('positional_drafts', False))
    policy = VLAPolicy.from_pretrained(model, **options)
    if positional:
        continue_drafts_by_position(policy.engine.runner.codec)
        engine_options = {k: v for k, v in options.items() if k != 'mode'}
        policy.engine = engine_for(policy, options.get('mode', 'pipeline_spec'),
                                   **engine_options)
    return policy


def row_summary(values, reference, ar_p50: float | None) -> dict:
    ms = np.array([m for m, _, _ in values])
    forwards = np.array([f for _, f, _ in values])
    p50 = float(np.percentile(ms, 50))
    return {'ms_p50': p50, 'ms_p90': float(np.percentile(ms, 90)),
            'ms_p99': float(np.percentile(ms, 99)), 'ms_mean': float(ms.mean()),
            'forwards_mean': float(forwards.mean()), 'forwards_p50': float(np.median(forwards)),
            'one_forward': float(np.mean(forwards == 1)),
            'at_most_two': float(np.mean(forwards <= 2)),
            'p50_x_ar': p50 / ar_p50 if ar_p50 else float('nan'),
            'tokens_equal_ar': [t for _, _, t in values] == reference}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo-fast')
    parser.add_argument('--rows', default='ar,pipeline_spec',
                        help='comma-separated: a mode, or label=mode:option=value:...; the '
                             'first row named ar is the baseline')
    parser.add_argument('--rate', type=float, default=30.0)
    parser.add_argument('--frames', type=int, default=300)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--seed', type=int, default=2000,
                        help='episode seeds of the frames (2000: validation placements)')
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--write-observations', default=None, metavar='NPZ',
                        help='only write --frames frames of seed --seed as train-draft '
                             'observations, then stop')
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    if args.frames < 1 or args.rounds < 1 or args.rate <= 0:
        parser.error('--frames and --rounds must be >= 1 and --rate > 0')

    import torch

    from frame_runs import WARMUP_FRAMES, run_frames   # bench/, beside this script
    from records import parse_row, write_record

    from vla_spec_ros.harness import streaming
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    torch.set_num_threads(args.threads)
    tasks = list(DEFAULT_TASK_NAMES)
    if args.write_observations:
        image_size = VLAPolicy.from_pretrained(args.model, mode='ar').model_config.image_size
        frames = streaming.stream_frames(tasks, args.frames, image_size, args.seed)
        write_observations(args.write_observations, frames)
        return
    rows = dict(parse_row(text) for text in args.rows.split(','))
    if 'ar' not in rows:
        parser.error('--rows: needs a row named ar (the baseline)')
    policies = {label: load_row(args.model, options) for label, options in rows.items()}
    unnorm_key = _resolve_unnorm_key(policies['ar'], None)
    frames = streaming.stream_frames(tasks, WARMUP_FRAMES + args.frames,
                                     policies['ar'].model_config.image_size, args.seed,
                                     unnorm_key)
    measured = {label: [] for label in rows}
    for _ in range(args.rounds):
        for label, policy in policies.items():
            measured[label] += run_frames(policy, frames, unnorm_key, 1.0 / args.rate)
    reference = [t for _, _, t in measured['ar']]
    ar_p50 = float(np.percentile([m for m, _, _ in measured['ar']], 50))
    results = {label: row_summary(values, reference, ar_p50)
               for label, values in measured.items()}
    command = 'python3 bench/paced_drafts.py ' + ' '.join(sys.argv[1:] if argv is None else argv)
    title = f'# Drafters at the camera\'s pace, model only ({time.strftime("%Y-%m-%d %H:%M:%S")})'
    lines = [title,
             '', f'command: `{command}`', '',
             f'model {args.model}; {args.frames} frames x {args.rounds} rounds (interleaved), '
             f'one every {1e3 / args.rate:.1f} ms, seed {args.seed}, {args.threads} thread(s)',
             '', '| row | ms p50 | ms p90 | ms p99 | ms mean | p50 ×AR | forwards mean | '
             'forwards p50 | one forward | at most two | tokens = AR |',
             '|---|---|---|---|---|---|---|---|---|---|---|']
    for label, r in results.items():
        lines.append(f"| {label} | {r['ms_p50']:.1f} | {r['ms_p90']:.1f} | {r['ms_p99']:.1f} | "
                     f"{r['ms_mean']:.1f} | {r['p50_x_ar']:.2f} | {r['forwards_mean']:.2f} | "
                     f"{r['forwards_p50']:.0f} | {r['one_forward']:.2f} | "
                     f"{r['at_most_two']:.2f} | {r['tokens_equal_ar']} |")
    text = '\n'.join(lines)
    print(text)
    if args.out:
        write_record(args.out, 'paced_drafts', text,
                     {'command': command, 'rows': rows, 'results': results})


if __name__ == '__main__':
    main()
