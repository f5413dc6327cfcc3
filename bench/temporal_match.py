"""How alike are a policy's consecutive actions? The premise of temporal drafting.

For each of the embedded model's six Meta-World tasks, the model's greedy (AR) action tokens
along the scripted expert's path, one control step apart (held-out seeds): the share of tokens
equal to the previous frame's, how far (in bins) the others are, and the verifications per
action a chain of the previous frame's tokens would take (after the prefill's token, each
verification accepts the chain up to its first wrong token and adds the verifier's own).

    python bench/temporal_match.py [--steps 60] [--stride 1] [--out FILE.md]

Needs the simulator (bash scripts/install.sh sim). Plain arithmetic on the AR tokens: no
engine mode runs here (`vla-spec bench --draft-path previous_action` times the real thing).
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def verifications(current, previous) -> int:
    """Verifications after the prefill to decide ``current[1:]`` with ``previous`` drafted."""
    decided, count = 1, 0
    while decided < len(current):
        accepted = 0
        while (decided + accepted < len(current)
               and previous[decided + accepted] == current[decided + accepted]):
            accepted += 1
        decided += accepted + 1
        count += 1
    return count


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=60, help='control steps per task')
    parser.add_argument('--stride', type=int, default=1, help='control steps between frames')
    parser.add_argument('--seed', type=int, default=5)
    parser.add_argument('--out', default=None, help='also write the table to this file')
    args = parser.parse_args(argv)

    from vla_spec_ros.engine.ar import reference_tokens
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.frames import HELD_OUT_SEED, sim_frames
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    policy = VLAPolicy.from_pretrained('metaworld-demo', device='cpu', dtype='float32')
    runner = policy.engine.runner
    lines = [f'`python bench/temporal_match.py --steps {args.steps} --stride {args.stride} '
             f'--seed {args.seed}`: the embedded model\'s AR tokens along the expert\'s path',
             '', '| task | frames | tokens equal to the previous frame\'s | verifications per '
             'action with the previous action drafted (AR: 6) |', '|---|---|---|---|']
    distances: Counter = Counter()
    all_equal, all_rounds = [], []
    for task in DEFAULT_TASK_NAMES:
        frames = sim_frames([task], args.steps, runner.cfg.image_size,
                            seed=HELD_OUT_SEED + args.seed, stride=args.stride,
                            unnorm_key=policy.unnorm_keys[0])
        tokens = [np.array(t) for t in reference_tokens(runner, frames, policy.config)]
        equal = [np.mean(tokens[t] == tokens[t - 1]) for t in range(1, len(tokens))]
        rounds = [verifications(tokens[t], tokens[t - 1]) for t in range(1, len(tokens))]
        for t in range(1, len(tokens)):
            distances.update(np.minimum(np.abs(tokens[t] - tokens[t - 1]), 5).tolist())
        all_equal += equal
        all_rounds += rounds
        lines.append(f'| {task} | {len(tokens)} | {np.mean(equal):.0%} | '
                     f'{np.mean(rounds):.2f} |')
    lines.append(f'| all | {len(all_equal) + len(DEFAULT_TASK_NAMES)} | {np.mean(all_equal):.0%} '
                 f'| {np.mean(all_rounds):.2f} |')
    total = sum(distances.values())
    lines += ['', 'Bin distance to the previous frame\'s token: ' + ', '.join(
        f'{"≥5" if d == 5 else d}: {distances[d] / total:.1%}' for d in range(6))]
    text = '\n'.join(lines) + '\n'
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == '__main__':
    sys.exit(main())
