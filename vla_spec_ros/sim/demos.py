"""Scripted demonstrations and the episode loop shared by data collection and evaluation.

Runs Meta-World's built-in scripted experts through `MetaWorldTask` (the same images and 7-dim
actions a VLA sees), keeps the successful episodes, and writes a compact dataset for training the
embedded default model:

    out_dir/<task>.npz            per task, compressed:
        images (N, H, W, 3) uint8, actions (N, 7) float32, instructions (N,) str,
        episode_index (N,) int32 (unique over the dataset), step_index (N,) int32,
        episode_seeds (E,) int64, episode_instructions (E,) str, episode_lengths (E,) int32,
        states (N, 39) float32 (Meta-World's state vector the expert read at each image)
    out_dir/dataset_statistics.json   OpenVLA norm_stats: {dataset_name: {"action": {mean, std,
        max, min, q01, q99, mask}, num_transitions, num_trajectories}} (docs/openvla.md)
    out_dir/manifest.json             seeds, versions, per-task counts, conventions, the
        camera's 3 x 4 projection to image pixels (``camera_matrix``, sim/camera_projection.py)

Images are the observation the action was chosen from; an episode ends at the first success.
`evaluate_scripted` measures the expert with the same loop (`run_episode`) that evaluates a model
in process, so the expert's rate and the model's are comparable.
"""

from __future__ import annotations

import json
import os
import platform
import zlib
from dataclasses import dataclass
from importlib import metadata
from typing import Callable, Sequence

import numpy as np

from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
from vla_spec_ros.sim.metaworld_env import (
    ACTION_DIM, DEFAULT_CAMERA, DEFAULT_IMAGE_SIZE, DEFAULT_MAX_STEPS, POSITION_SCALE_M,
    MetaWorldTask, TaskSpec, get_task, make_env)

DATASET_NAME = "metaworld_scripted"
# Un-normalize the 6 motion dims; the gripper is absolute (OpenVLA EEF_POS convention).
ACTION_MASK = (True, True, True, True, True, True, False)
STATISTICS_FILE = "dataset_statistics.json"
MANIFEST_FILE = "manifest.json"

# policy(image (H, W, 3) uint8, instruction) -> action (7,)
Policy = Callable[[np.ndarray, str], np.ndarray]


@dataclass(frozen=True)
class EpisodeResult:
    task_name: str
    seed: int
    instruction: str
    is_success: bool
    num_steps: int


def episode_seed(seed: int, task_name: str, episode: int) -> int:
    """Seed of one episode: a function of (seed, task, episode), not of the task order."""
    task_key = zlib.crc32(get_task(task_name).name.encode())
    return int(np.random.SeedSequence([int(seed), task_key, int(episode)]).generate_state(1)[0])


def choose_instruction(task: TaskSpec, seed: int) -> str:
    """The phrasing used by the episode with this seed."""
    return task.instructions[int(np.random.default_rng(seed).integers(len(task.instructions)))]


def run_episode(env: MetaWorldTask, policy: Policy, seed: int, instruction: str,
                is_recording: bool = False, delay: DelayedLockstep | None = None,
                on_step: Callable | None = None, with_period: bool = False):
    """One episode from `env.reset(seed)` until success or `env.max_steps`.

    Returns (EpisodeResult, images (T, H, W, 3) uint8 | None, actions (T, 7) float32 | None);
    images[t] is the observation actions[t] was chosen from.

    `delay` (a `delayed_lockstep.DelayedLockstep`, not with `is_recording`): delayed lock-step, the
    same schedule the bridge node applies; the policy is asked only for the frames `delay`
    wants, and may then answer None (no valid action: the episode ends unsuccessfully, as the
    bridge ends it after republishing an unanswered frame). A chunked policy (a (K, 7) plan
    per frame) needs `delay` (d = 0 for none): it executes each chunk on the control clock,
    time-aligned, latest chunk first (delayed_lockstep module doc). `on_step(period, action,
    is_fresh)` sees every applied action; `delay.source` says which chunk step it was.
    `with_period`: the policy is called as policy(image, instruction, period) (the control step
    of the image, for a drafter that shifts the previous chunk).
    """
    if delay is not None and is_recording:
        raise ValueError("is_recording: not with a delay (the recorded pairs assume none)")
    image = env.reset(seed)
    if delay is not None:
        delay.begin_episode()
    images, actions = [], []
    is_success, is_done, period = False, False, 0
    while not is_done:
        is_fresh = True
        args = (image, instruction, period) if with_period else (image, instruction)
        if delay is None:
            action = np.asarray(policy(*args), dtype=np.float32)
            if action.ndim == 2 and action.shape[1:] == (ACTION_DIM,):
                raise ValueError(f"policy: answered a chunk {action.shape}; run a chunked "
                                 "policy with delay=DelayedLockstep() (executed time-aligned)")
            if action.shape != (ACTION_DIM,) or not np.all(np.isfinite(action)):
                raise ValueError(f"policy: expected a finite ({ACTION_DIM},) action, got "
                                 f"{action}")
        else:
            if delay.wants_frame(period):
                answer = policy(*args)
                if answer is None:
                    break
                delay.answer(period, answer)
            action, is_fresh = delay.action_at(period)
        if is_recording:
            images.append(image)
            actions.append(action)
        if on_step is not None:
            on_step(period, action, is_fresh)
        image, is_success, is_done, _ = env.step(action)
        period += 1
    result = EpisodeResult(env.task.name, int(seed), instruction, bool(is_success), env.num_steps)
    if not is_recording:
        return result, None, None
    return result, np.stack(images), np.stack(actions)


def _expert_policy(env: MetaWorldTask) -> Policy:
    return lambda image, instruction: env.expert_action()


def _progress(iterable, total: int, desc: str, is_enabled: bool):
    if not is_enabled:
        return iterable
    from tqdm import tqdm
    return tqdm(iterable, total=total, desc=desc, leave=True)


def _evaluate(task_name: str, make_policy: Callable[[MetaWorldTask], Policy], episodes: int,
              seed: int, image_size: int, camera: str, max_steps: int,
              progress: bool, delay: DelayedLockstep | None = None) -> list[EpisodeResult]:
    if not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes: expected a positive int, got {episodes!r}")
    task = get_task(task_name)
    results = []
    with make_env(task.name, seed=seed, image_size=image_size, camera=camera,
                  max_steps=max_steps) as env:
        policy = make_policy(env)
        bar = _progress(range(episodes), episodes, f"eval {task.name}", progress)
        for episode in bar:
            ep_seed = episode_seed(seed, task.name, episode)
            result, _, _ = run_episode(env, policy, ep_seed, choose_instruction(task, ep_seed),
                                       delay=delay)
            results.append(result)
            if progress:
                bar.set_postfix(success=f"{sum(r.is_success for r in results)}/{len(results)}")
    return results


def evaluate_policy(task_name: str, policy: Policy, episodes: int, seed: int,
                    image_size: int = DEFAULT_IMAGE_SIZE, camera: str = DEFAULT_CAMERA,
                    max_steps: int = DEFAULT_MAX_STEPS, progress: bool = False,
                    delay: DelayedLockstep | None = None) -> list[EpisodeResult]:
    """Run `episodes` seeded episodes of `policy(image, instruction) -> action7` in process
    (with `delay`: delayed lock-step, `run_episode`)."""
    return _evaluate(task_name, lambda env: policy, episodes, seed, image_size, camera,
                     max_steps, progress, delay)


def evaluate_scripted(task: str, episodes: int, seed: int, image_size: int = DEFAULT_IMAGE_SIZE,
                      camera: str = DEFAULT_CAMERA, max_steps: int = DEFAULT_MAX_STEPS,
                      progress: bool = False) -> float:
    """Success rate in [0, 1] of the task's scripted expert, by the same loop as a model."""
    results = _evaluate(task, _expert_policy, episodes, seed, image_size, camera, max_steps,
                        progress)
    return success_rate(results)


def success_rate(results: Sequence[EpisodeResult]) -> float:
    if not results:
        raise ValueError("results: empty")
    return sum(r.is_success for r in results) / len(results)


def action_norm_stats(actions: np.ndarray, num_trajectories: int) -> dict:
    """OpenVLA `norm_stats` entry for actions (N, 7): q01/q99 by linear interpolation."""
    actions = np.asarray(actions, dtype=np.float64)
    if actions.ndim != 2 or actions.shape[1] != ACTION_DIM or actions.shape[0] == 0:
        raise ValueError(f"actions: expected shape (N>0, {ACTION_DIM}), got {actions.shape}")
    stats = {
        "mean": actions.mean(axis=0),
        "std": actions.std(axis=0),
        "max": actions.max(axis=0),
        "min": actions.min(axis=0),
        "q01": np.quantile(actions, 0.01, axis=0),
        "q99": np.quantile(actions, 0.99, axis=0),
    }
    action = {key: [float(x) for x in value] for key, value in stats.items()}
    action["mask"] = list(ACTION_MASK)
    return {"action": action, "num_transitions": int(actions.shape[0]),
            "num_trajectories": int(num_trajectories)}


def _versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in ("metaworld", "mujoco", "gymnasium", "numpy"):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    versions["MUJOCO_GL"] = os.environ.get("MUJOCO_GL")
    return versions


def collect_demos(out_dir: str, tasks: Sequence[str], episodes_per_task: int,
                  image_size: int = DEFAULT_IMAGE_SIZE, seed: int = 0,
                  max_steps: int = DEFAULT_MAX_STEPS, progress: bool = True,
                  camera: str = DEFAULT_CAMERA, dataset_name: str = DATASET_NAME,
                  action_noise: float = 0.0) -> dict:
    """Collect scripted demonstrations; returns the manifest written to out_dir/manifest.json.

    Runs `episodes_per_task` seeded episodes per task and keeps the successful ones.
    `action_noise` > 0 (DART-style): the arm executes the expert's position delta plus Gaussian
    noise of that standard deviation (a fraction of the 1 cm largest step; the result clipped to
    the action box, the gripper untouched), while the recorded label is the expert's own action
    at every visited state: the demonstrations then show how the expert corrects a drift, which a
    policy's own errors cause at test time. The noise is seeded by the episode's seed.
    """
    if not (isinstance(action_noise, (int, float)) and 0.0 <= action_noise <= 1.0):
        raise ValueError(f"action_noise: expected a number in [0, 1], got {action_noise!r}")
    if not tasks:
        raise ValueError("tasks: expected at least one task name")
    specs = [get_task(name) for name in tasks]
    if len({spec.name for spec in specs}) != len(specs):
        raise ValueError(f"tasks: duplicate task names in {list(tasks)}")
    if not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise ValueError(f"episodes_per_task: expected a positive int, got {episodes_per_task!r}")
    if not dataset_name:
        raise ValueError("dataset_name: expected a non-empty string")
    made_out_dir = not os.path.exists(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    all_actions, task_counts = [], {}
    num_episodes, projection = 0, None
    for spec in specs:
        images, actions, instructions, episode_index, step_index = [], [], [], [], []
        kept_seeds, kept_instructions, kept_lengths, states = [], [], [], []
        with make_env(spec.name, seed=seed, image_size=image_size, camera=camera,
                      max_steps=max_steps) as env:
            projection = env.camera_matrix()
            episode_states, labels, noise = [], [], [np.random.default_rng(0)]

            def policy(image, instruction):
                # The state the expert reads for this image (a reasoning's facts: data).
                episode_states.append(env.state.astype(np.float32))
                label = env.expert_action()
                labels.append(label)
                if action_noise == 0.0:
                    return label
                executed = label.copy()
                executed[:3] = np.clip(executed[:3] + noise[0].normal(
                    0.0, action_noise * POSITION_SCALE_M, 3), -POSITION_SCALE_M,
                    POSITION_SCALE_M)
                return executed

            bar = _progress(range(episodes_per_task), episodes_per_task, spec.name, progress)
            for episode in bar:
                ep_seed = episode_seed(seed, spec.name, episode)
                instruction = choose_instruction(spec, ep_seed)
                episode_states.clear()
                labels.clear()
                noise[0] = np.random.default_rng([ep_seed, 1])
                result, ep_images, _ = run_episode(env, policy, ep_seed, instruction,
                                                   is_recording=True)
                ep_actions = np.stack(labels).astype(np.float32)
                if result.is_success:
                    states.append(np.stack(episode_states))
                    num_steps = len(ep_actions)
                    images.append(ep_images)
                    actions.append(ep_actions)
                    instructions.extend([instruction] * num_steps)
                    episode_index.append(np.full(num_steps, num_episodes, dtype=np.int32))
                    step_index.append(np.arange(num_steps, dtype=np.int32))
                    kept_seeds.append(ep_seed)
                    kept_instructions.append(instruction)
                    kept_lengths.append(num_steps)
                    num_episodes += 1
                if progress:
                    bar.set_postfix(kept=f"{len(kept_seeds)}/{episode + 1}")
        file_name = f"{spec.name}.npz"
        if kept_seeds:
            task_actions = np.concatenate(actions)
            all_actions.append(task_actions)
            np.savez_compressed(
                os.path.join(out_dir, file_name),
                images=np.concatenate(images), actions=task_actions,
                instructions=np.array(instructions), episode_index=np.concatenate(episode_index),
                step_index=np.concatenate(step_index),
                episode_seeds=np.array(kept_seeds, dtype=np.int64),
                episode_instructions=np.array(kept_instructions),
                episode_lengths=np.array(kept_lengths, dtype=np.int32),
                states=np.concatenate(states))
        task_counts[spec.name] = {
            "env_name": spec.env_name,
            "file": file_name if kept_seeds else None,
            "instructions": list(spec.instructions),
            "num_attempted": episodes_per_task,
            "num_kept": len(kept_seeds),
            "expert_success_rate": len(kept_seeds) / episodes_per_task,
            "num_transitions": int(sum(kept_lengths)),
        }
    if not all_actions:
        if made_out_dir:
            os.rmdir(out_dir)       # made above and still empty: no task file was written
        raise ValueError(f"collect_demos: the expert succeeded in none of the "
                         f"{episodes_per_task} episode(s) per task of {list(tasks)} within "
                         f"max_steps {max_steps}; nothing written (more episodes or steps?)")
    stats = {dataset_name: action_norm_stats(np.concatenate(all_actions), num_episodes)}
    with open(os.path.join(out_dir, STATISTICS_FILE), "w") as f:
        json.dump(stats, f, indent=2)
    manifest = {
        "dataset_name": dataset_name,
        "seed": int(seed),
        "episode_seed_rule": "SeedSequence([seed, crc32(task name), episode]).generate_state(1)",
        "episodes_per_task": episodes_per_task,
        "image_size": int(image_size),
        "camera": camera,
        "camera_matrix": np.asarray(projection).tolist(),
        "action_noise": float(action_noise),
        "max_steps": int(max_steps),
        "action": {
            "layout": "dx, dy, dz (m per step), droll, dpitch, dyaw (rad, always 0), gripper",
            "position_scale_m": POSITION_SCALE_M,
            "gripper": "absolute, 1 = open, 0 = closed; metaworld effort = 1 - 2 * gripper",
        },
        "versions": _versions(),
        "num_transitions": stats[dataset_name]["num_transitions"],
        "num_trajectories": num_episodes,
        "tasks": task_counts,
    }
    with open(os.path.join(out_dir, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


@dataclass(frozen=True)
class DemoSet:
    """All transitions of a collected dataset, concatenated in task order."""

    images: np.ndarray          # (N, H, W, 3) uint8
    actions: np.ndarray         # (N, 7) float32
    instructions: np.ndarray    # (N,) str
    episode_index: np.ndarray   # (N,) int32
    task_index: np.ndarray      # (N,) int32, into task_names
    task_names: tuple[str, ...]
    norm_stats: dict
    # Collected since 2026-11-29 (None in older datasets): the state the expert read at each
    # image, and the camera's projection (collect_demos' docstring).
    states: np.ndarray | None = None         # (N, 39) float32
    step_index: np.ndarray | None = None     # (N,) int32, within the episode
    camera_matrix: np.ndarray | None = None  # (3, 4)

    def expert_facts(self) -> list:
        """What the expert knew at each transition (sim/expert_facts.py), for a reasoning
        policy's training text; ValueError for a dataset collected without states."""
        if self.states is None or self.camera_matrix is None:
            raise ValueError("--data: these demonstrations carry no expert states or camera "
                             "projection; collect them again with `vla-spec collect-demos`")
        from .expert_facts import expert_facts
        size = self.images.shape[1]
        return [expert_facts(self.task_names[task], state, action, self.camera_matrix, size)
                for task, state, action in zip(self.task_index, self.states, self.actions)]


def load_demos(data_dir: str, tasks: Sequence[str] | None = None) -> DemoSet:
    """Read a dataset written by `collect_demos` (all its tasks, or the named ones)."""
    with open(os.path.join(data_dir, MANIFEST_FILE)) as f:
        manifest = json.load(f)
    with open(os.path.join(data_dir, STATISTICS_FILE)) as f:
        norm_stats = json.load(f)
    names = list(manifest["tasks"]) if tasks is None else [get_task(t).name for t in tasks]
    parts = {key: [] for key in ("images", "actions", "instructions", "episode_index",
                                 "step_index", "states")}
    task_index, task_names = [], []
    for name in names:
        if name not in manifest["tasks"]:
            raise ValueError(f"tasks: {name!r} is not in the dataset at {data_dir}")
        entry = manifest["tasks"][name]
        if entry["file"] is None:
            continue
        with np.load(os.path.join(data_dir, entry["file"]), allow_pickle=False) as data:
            for key in parts:
                if key in data:
                    parts[key].append(data[key])
            task_index.append(np.full(len(data["actions"]), len(task_names), dtype=np.int32))
        task_names.append(name)
    if not task_names:
        raise ValueError(f"tasks: no transitions for {names} in {data_dir}")
    return DemoSet(images=np.concatenate(parts["images"]),
                   actions=np.concatenate(parts["actions"]),
                   instructions=np.concatenate(parts["instructions"]),
                   episode_index=np.concatenate(parts["episode_index"]),
                   task_index=np.concatenate(task_index), task_names=tuple(task_names),
                   norm_stats=norm_stats, states=_whole(parts["states"], len(task_names)),
                   step_index=_whole(parts["step_index"], len(task_names)),
                   camera_matrix=(np.asarray(manifest["camera_matrix"])
                                  if "camera_matrix" in manifest else None))


def load_demo_sets(data_dirs: Sequence[str]) -> DemoSet:
    """Several datasets of the same tasks as one (e.g. clean demonstrations and DART-perturbed
    ones, collected with different seeds): transitions concatenated folder by folder, episode
    indices kept unique, ``norm_stats`` computed again over every action under the first
    dataset's name. The folders must share tasks, image size and camera projection."""
    if not data_dirs:
        raise ValueError("data_dirs: expected at least one folder")
    sets = [load_demos(d) for d in data_dirs]
    if len(sets) == 1:
        return sets[0]
    first = sets[0]
    for d, other in zip(data_dirs[1:], sets[1:]):
        if (other.task_names != first.task_names
                or other.images.shape[1:] != first.images.shape[1:]):
            raise ValueError(f"{d}: tasks {other.task_names} and images "
                             f"{other.images.shape[1:]} differ from {data_dirs[0]}'s")
    offsets = np.cumsum([0] + [int(s.episode_index.max()) + 1 for s in sets[:-1]])
    actions = np.concatenate([s.actions for s in sets])
    (name, _), = first.norm_stats.items()
    episodes = np.concatenate([s.episode_index + o for s, o in zip(sets, offsets)])
    has = lambda field: all(getattr(s, field) is not None for s in sets)  # noqa: E731
    return DemoSet(
        images=np.concatenate([s.images for s in sets]), actions=actions,
        instructions=np.concatenate([s.instructions for s in sets]),
        episode_index=episodes.astype(np.int32),
        task_index=np.concatenate([s.task_index for s in sets]), task_names=first.task_names,
        norm_stats={name: action_norm_stats(actions, len(np.unique(episodes)))},
        states=np.concatenate([s.states for s in sets]) if has("states") else None,
        step_index=np.concatenate([s.step_index for s in sets]) if has("step_index") else None,
        camera_matrix=first.camera_matrix)


def _whole(arrays: list, num_files: int) -> np.ndarray | None:
    """The concatenation when every task file has the array, else None (an older dataset)."""
    return np.concatenate(arrays) if len(arrays) == num_files else None
