"""Meta-World observations as engine frames: the images the embedded model acts on, for
measurements that need its real input distribution (the demo's camera-rate columns, `vla-spec
bench --frames-from metaworld`). Needs the simulator (metaworld, mujoco)."""
from __future__ import annotations

import dataclasses

import numpy as np

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


def episode_frames(num: int, image_size: int, seed: int, unnorm_key: str | None,
                   num_streams: int = 1) -> list[Frame]:
    """`num` frames as robots' cameras see them: each stream a run of consecutive control
    steps of the scripted expert's path (held-out seeds), ``ceil(num / num_streams / 6)``
    steps from each of the six tasks in turn (a new task: a new episode and instruction),
    each run starting at a seeded random step of its episode so that the runs cover every
    phase (reach, grasp, push, ...) and not only the start (an episode shorter than a run
    gives its whole path, and the tasks go round again). Frame i belongs to stream
    ``i % num_streams``, as in `bench.make_frames`. Consecutive frames of a stream are the
    consecutive observations temporal drafting (``draft_path: previous_action``) relies on;
    `benchmark_frames` takes the tasks in turn frame by frame instead."""
    from .metaworld_env import DEFAULT_TASK_NAMES, get_task, make_env, sim_unavailable_reason
    reason = sim_unavailable_reason()
    if reason is not None:
        raise RuntimeError(f'Meta-World frames need the simulator (bash scripts/install.sh '
                           f'sim): {reason}')
    per_stream = -(-num // num_streams)
    run = -(-per_stream // len(DEFAULT_TASK_NAMES))
    rng = np.random.default_rng(seed)
    streams = []
    for s in range(num_streams):
        frames = []
        t = 0
        while len(frames) < per_stream:         # a short episode gives a short run: go on
            task = get_task(DEFAULT_TASK_NAMES[t % len(DEFAULT_TASK_NAMES)])
            episode_seed = HELD_OUT_SEED + seed * 1000 + s * 100 + t
            t += 1
            with make_env(task.name, seed=episode_seed, image_size=image_size) as env:
                images = [env.reset(episode_seed)]
                is_done = False
                while not is_done:                  # the whole episode: the run's start
                    image, _, is_done, _ = env.step(env.expert_action())   # is uniform in it
                    images.append(image)
            start = int(rng.integers(0, max(len(images) - run, 0) + 1))
            images = images[start:start + run]
            # Each frame carries its control step (a chunked model's draft shifts the previous
            # chunk by the steps between frames); a new episode's steps start far from the last.
            frames += [Frame(image, task.instructions[0], unnorm_key, f'stream{s}',
                             control_step=1000 * t + start + k)
                       for k, image in enumerate(images)]
        streams.append(frames)
    return [streams[i % num_streams][i // num_streams] for i in range(num)]


__all__ = ['HELD_OUT_SEED', 'sim_frames', 'benchmark_frames', 'episode_frames']
