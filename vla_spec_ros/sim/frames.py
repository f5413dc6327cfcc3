"""Meta-World observations as engine frames: the images the embedded model acts on, for
measurements that need its real input distribution (the demo's camera-rate columns, `vla-spec
bench --frames-from metaworld`). Needs the simulator (metaworld, mujoco)."""
from __future__ import annotations

import dataclasses

from ..engine.result import Frame

# Environment seeds of benchmark frames: far from the demonstrations' episode seeds (32-bit
# values drawn by sim.demos.episode_seed), like the demo's evaluation seeds.
HELD_OUT_SEED = 1000


def sim_frames(tasks, per_task: int, image_size: int, seed: int = 7, stride: int = 5,
               unnorm_key: str | None = None, stream_id: str = 'default') -> list[Frame]:
    """`per_task` Meta-World observations per task along the scripted expert's path (every
    `stride`-th step), with the task's first phrasing, task after task."""
    from .metaworld_env import get_task, make_env
    frames = []
    for name in tasks:
        task = get_task(name)
        with make_env(task.name, seed=seed, image_size=image_size) as env:
            image = env.reset(seed)
            for step in range(per_task * stride):
                if step % stride == 0:
                    frames.append(Frame(image, task.instructions[0], unnorm_key, stream_id))
                image, _, is_done, _ = env.step(env.expert_action())
                if is_done:
                    image = env.reset(seed + step + 1)
    return frames


def benchmark_frames(num: int, image_size: int, seed: int, unnorm_key: str | None,
                     num_streams: int = 1) -> list[Frame]:
    """`num` held-out observations of the embedded model's six tasks (``DEFAULT_TASK_NAMES``,
    the ones its demonstrations cover), the tasks taken in turn (so that any prefix, the
    warm-up frames included, covers them evenly), streams assigned round robin as
    `bench.make_frames` does."""
    from .metaworld_env import DEFAULT_TASK_NAMES, sim_unavailable_reason
    reason = sim_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f'Meta-World frames need the simulator (bash scripts/install.sh '
                           f'sim): {reason}')
    tasks = DEFAULT_TASK_NAMES
    per_task = -(-num // len(tasks))
    by_task = sim_frames(tasks, per_task, image_size, seed=HELD_OUT_SEED + seed,
                         unnorm_key=unnorm_key)
    in_turn = [by_task[task * per_task + i] for i in range(per_task)
               for task in range(len(tasks))]
    return [dataclasses.replace(frame, stream_id=f'stream{i % num_streams}')
            for i, frame in enumerate(in_turn[:num])]


__all__ = ['HELD_OUT_SEED', 'sim_frames', 'benchmark_frames']
