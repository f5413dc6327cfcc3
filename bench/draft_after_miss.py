"""The draft after a miss (ActionCodec.draft_after_miss): one robot's consecutive control steps,
model only, in process, a speculative mode (--mode) with the model's default draft, the bound
set to each value given ('none': no bound) against AR, interleaved over --rounds, back to
back or one frame every 1 / --rate s. Prints per-frame ms (p50, p99, mean), verifier
forwards per frame and each row's p99 against the unbounded row's, and checks every row's
tokens equal AR's.

    python3 bench/draft_after_miss.py --model metaworld-demo-fast --bounds none,0,1,2,4 \
        --rounds 2 --out bench/results/draft_after_miss
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo-fast')
    parser.add_argument('--bounds', default='none,2', help="comma-separated: 'none' or ints")
    parser.add_argument('--frames', type=int, default=300)
    parser.add_argument('--rounds', type=int, default=2)
    parser.add_argument('--seed', type=int, default=3000)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--mode', default='spec', choices=['spec', 'pipeline_spec'])
    parser.add_argument('--rate', type=float, default=0.0,
                        help='frames per second (0: back to back)')
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)

    import torch

    from frame_runs import WARMUP_FRAMES, run_frames   # bench/, beside this script

    from vla_spec_ros.harness import streaming
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    torch.set_num_threads(args.threads)
    rows = {'ar': VLAPolicy.from_pretrained(args.model, mode='ar')}
    for text in args.bounds.split(','):
        policy = VLAPolicy.from_pretrained(args.model, mode=args.mode)
        policy.engine.strategy.draft_after_miss = None if text == 'none' else int(text)
        rows[f'{args.mode}, bound {text}'] = policy
    codec_value = rows[next(k for k in rows if k != 'ar')].engine.runner.codec.draft_after_miss
    unnorm_key = _resolve_unnorm_key(rows['ar'], None)
    frames = streaming.stream_frames(list(DEFAULT_TASK_NAMES), WARMUP_FRAMES + args.frames,
                                     rows['ar'].model_config.image_size, args.seed, unnorm_key)
    measured = {label: [] for label in rows}
    period = 1.0 / args.rate if args.rate > 0 else 0.0
    for _ in range(args.rounds):
        for label, policy in rows.items():
            measured[label] += run_frames(policy, frames, unnorm_key, period)
    reference = [tokens for _, _, tokens in measured['ar']]
    base = next((k for k in rows if k.endswith('bound none')), None)
    base_p99 = np.percentile([m for m, _, _ in measured[base]], 99) if base else None
    command = 'python3 bench/draft_after_miss.py ' + ' '.join(
        sys.argv[1:] if argv is None else argv)
    lines = [f'# The draft after a miss ({time.strftime("%Y-%m-%d %H:%M:%S")})', '',
             f'command: `{command}`', '',
             f'model {args.model}; the codec\'s own bound: {codec_value}; {args.frames} frames '
             f'x {args.rounds} rounds (interleaved), seed {args.seed}, {args.threads} thread(s), '
             f'{f"{args.rate:g} frames/s" if period else "back to back"}',
             '', '| row | ms p50 | ms p99 | ms mean | forwards mean | forwards p99 | '
             'p99 vs unbounded | tokens = AR |', '|---|---|---|---|---|---|---|---|']
    for label, values in measured.items():
        ms = np.array([m for m, _, _ in values])
        forwards = np.array([f for _, f, _ in values])
        same = [tokens for _, _, tokens in values] == reference
        ratio = (f'{np.percentile(ms, 99) / base_p99:.2f}' if base_p99 and label != 'ar'
                 else '-')
        lines.append(f'| {label} | {np.percentile(ms, 50):.1f} | {np.percentile(ms, 99):.1f} | '
                     f'{ms.mean():.1f} | {forwards.mean():.2f} | {np.percentile(forwards, 99):.1f}'
                     f' | {ratio} | {same} |')
    text = '\n'.join(lines)
    print(text)
    if args.out:
        from records import write_record      # bench/, beside this script
        write_record(args.out, 'draft_after_miss', text)


if __name__ == '__main__':
    main()
