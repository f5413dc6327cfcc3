"""Held-out Meta-World success of an embedded model, model only: the simulator driven in process
(``sim.demos.run_episode``, lock-step with ``DelayedLockstep()``: a frame every control step,
no latency, d = 0), no ROS node, the chunks executed by the node's rules (``--blend``,
``--decay``, ``--on-invalid``: the node's ``chunk_blend``, ``chunk_ensemble_decay`` and
``invalid_chunk``, ros/chunk_rules.py).

    python3 bench/fast_success.py [--model metaworld-demo-fast] [--episodes 10] [--seed 1000]
        [--mode ar] [--tasks ...] [--blend latest|ensemble] [--on-invalid continue|hold]
        [--image-size N] [--out bench/results/fast_drafts]

``--seed 1000``: the demo's evaluation seeds (the shipped models' demonstrations used seed 0;
episode seeds are drawn from (seed, task, episode), sim/demos.episode_seed), with the same
instruction per episode as the node's closed loop (sim/demos.choose_instruction). Frames are
rendered at the model's own size, as the node's simulator bridge renders them (``--image-size``
renders larger and lets the policy resize: a different image). Strict modes give AR's tokens
(test/test_fast_drafts.py), so one mode's success is every strict mode's.

A single-step model (OpenVLA's, a reasoning model) runs the same loop with plans of one step.
The record counts refused frames per task (a chunk or action that does not decode) and the
mean tokens and verifier forwards per frame; ``--seed``: sim/placement_ranges.py says which
base seeds choose (validation, 2000) and which report (test, 3000).
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

    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.ros.chunk_rules import BLENDS, INVALID_CHUNK_RULES, blend_steps
    from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
    from vla_spec_ros.sim.demos import (choose_instruction, episode_seed, run_episode,
                                        success_rate)
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES, get_task, make_env
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--model', default='metaworld-demo-fast')
    p.add_argument('--episodes', type=int, default=10, help='per task')
    p.add_argument('--seed', type=int, default=1000)
    p.add_argument('--mode', default='ar')
    p.add_argument('--tasks', nargs='+', default=list(DEFAULT_TASK_NAMES))
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--blend', default='latest', choices=BLENDS,
                   help="the node's chunk_blend")
    p.add_argument('--decay', type=float, default=0.5, help="the node's chunk_ensemble_decay")
    p.add_argument('--on-invalid', default='continue', choices=INVALID_CHUNK_RULES,
                   help="the node's invalid_chunk")
    p.add_argument('--reasoning-every-n', type=int, default=1,
                   help="a reasoning model's reasoning_every_n (1: every frame, exact)")
    p.add_argument('--image-size', type=int, default=None,
                   help="rendered frame size (default: the model's own, as the node's bridge "
                        "renders; the policy resizes any other)")
    p.add_argument('--out', default=str(ROOT / 'bench' / 'results' / 'fast_drafts'))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    options = ({'reasoning_every_n': args.reasoning_every_n}
               if args.reasoning_every_n != 1 else {})
    policy = VLAPolicy.from_pretrained(args.model, mode=args.mode,
                                       restrict_to_action_tokens=False, **options)
    image_size = args.image_size or policy.model_config.image_size
    chunk = policy.model_config.action_chunk
    num_invalid = [0]
    tokens, forwards = [], []
    history = []    # (period, chunk) of this episode's valid chunks, the newest last

    def act(image, instruction, period):
        """A frame's plan for periods period .. period + K - 1, by the node's chunk rules
        (ros/chunk_rules.py): `latest` executes the newest valid chunk; `ensemble` the
        weighted mean of every valid chunk covering each step (weights exp(-decay * j), j = 0
        for the newest). A frame that does not decode adds no chunk: the chunks already
        planned keep running (`--on-invalid continue`, the node's default) or the arm holds
        still until a valid one (`hold`). A step no chunk covers is a zero motion, gripper
        open."""
        if period == 0:
            history.clear()
        result = policy.predict(image, instruction)
        tokens.append(len(result.tokens))
        forwards.append(result.stats['forward_passes'])
        if result.is_valid:
            history.append((period, np.asarray(result.action, dtype=np.float64).reshape(
                chunk, -1)))
        else:
            num_invalid[0] += 1
            if args.on_invalid == 'hold':
                history.clear()
        plan = []
        for step in range(period, period + chunk):
            covering = [c[step - start] for start, c in reversed(history)
                        if 0 <= step - start < len(c)]
            if args.blend == 'latest':
                covering = covering[:1]
            plan.append(blend_steps(covering, args.decay) if covering
                        else np.r_[np.zeros(6), 1.0])
        return np.stack(plan)

    started = time.time()
    per_task, invalid_per_task = {}, {}
    for name in args.tasks:
        task = get_task(name)
        results, invalid_before = [], num_invalid[0]
        with make_env(task.name, seed=args.seed, image_size=image_size) as env:
            for episode in range(args.episodes):
                ep_seed = episode_seed(args.seed, task.name, episode)
                result, _, _ = run_episode(env, act, ep_seed, choose_instruction(task, ep_seed),
                                           delay=DelayedLockstep(), with_period=True)
                results.append(result)
        per_task[task.name] = success_rate(results)
        invalid_per_task[task.name] = num_invalid[0] - invalid_before
        print(f'{task.name}: {per_task[task.name]:.2f} '
              f'{"".join("+" if r.is_success else "-" for r in results)}', flush=True)
    overall = sum(per_task.values()) / len(per_task)
    command = 'python3 bench/fast_success.py ' + ' '.join(shlex.quote(a) for a in argv)
    record = {'command': command, 'model': args.model, 'mode': args.mode,
              'episodes_per_task': args.episodes, 'seed': args.seed, 'image_size': image_size,
              'blend': args.blend, 'decay': args.decay, 'on_invalid': args.on_invalid,
              'reasoning_every_n': args.reasoning_every_n,
              'success': overall,
              'per_task': per_task, 'invalid_frames': num_invalid[0],
              'invalid_frames_per_task': invalid_per_task, 'frames': len(tokens),
              'tokens_per_frame': float(np.mean(tokens)),
              'forwards_per_frame': float(np.mean(forwards)),
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
