"""Held-out Meta-World success of a chunked model, model only: the simulator driven in process
(``sim.demos.evaluate_policy``, lock-step with ``DelayedLockstep()``: a frame every control
step, the newest chunk executed time-aligned, d = 0), no ROS node.

    python3 bench/fast_success.py [--model metaworld-demo-fast] [--episodes 10] [--seed 1000]
        [--mode ar] [--tasks ...] [--out bench/results/fast_drafts]

``--seed 1000``: the demo's evaluation seeds (the shipped models' demonstrations used seed 0;
episode seeds are drawn from (seed, task, episode), sim/demos.episode_seed). Strict modes give
AR's tokens (test/test_fast_drafts.py), so one mode's success is every strict mode's.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    import numpy as np

    from vla_spec_ros.engine.drafting.shifted_chunk_drafter import shift_chunk
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
    from vla_spec_ros.sim.demos import evaluate_policy, success_rate
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='metaworld-demo-fast')
    p.add_argument('--episodes', type=int, default=10, help='per task')
    p.add_argument('--seed', type=int, default=1000)
    p.add_argument('--mode', default='ar')
    p.add_argument('--tasks', nargs='+', default=list(DEFAULT_TASK_NAMES))
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--out', default=str(ROOT / 'bench' / 'results' / 'fast_drafts'))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    policy = VLAPolicy.from_pretrained(args.model, mode=args.mode,
                                       restrict_to_action_tokens=False)
    num_invalid = [0]
    last = {}       # the last valid chunk and how many control steps ago it was decided

    def act(image, instruction):
        """A frame's chunk; a frame that does not decode keeps the previous valid chunk
        running (re-sent shifted by the steps that passed, its last step held): what a node
        that refuses an invalid chunk does while its last chunk still covers the step. The
        first frames of a task have no previous chunk: a zero motion, gripper open (the chunk
        is kept across episodes of a task: a new episode whose first frame fails continues
        the last one's plan for a step)."""
        result = policy.predict(image, instruction)
        if result.is_valid:
            last.update(chunk=np.asarray(result.action), age=0)
            return last['chunk']
        num_invalid[0] += 1
        if 'chunk' not in last:
            return np.r_[np.zeros(6), 1.0]
        last['age'] += 1
        return shift_chunk(last['chunk'], last['age'])

    started = time.time()
    per_task = {}
    for task in args.tasks:
        last.clear()
        results = evaluate_policy(task, act, args.episodes, args.seed, delay=DelayedLockstep())
        per_task[task] = success_rate(results)
        print(f'{task}: {per_task[task]:.2f}', flush=True)
    overall = sum(per_task.values()) / len(per_task)
    command = 'python3 bench/fast_success.py ' + ' '.join(shlex.quote(a) for a in argv)
    record = {'command': command, 'model': args.model, 'mode': args.mode,
              'episodes_per_task': args.episodes, 'seed': args.seed, 'success': overall,
              'per_task': per_task, 'invalid_frames': num_invalid[0],
              'wall_s': time.time() - started}
    print(json.dumps(record, indent=2))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime('%Y%m%d-%H%M%S')
        (out / f'success-{stamp}.json').write_text(json.dumps(record, indent=2))
    return 0


if __name__ == '__main__':
    sys.exit(main())
