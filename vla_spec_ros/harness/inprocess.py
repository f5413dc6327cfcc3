"""In-process sweeps of the embedded model in Meta-World (no ROS): delay and relaxation.

The closed loop through ROS (`closed_loop.py`) is the reference path; these sweeps run the same
seeded episodes (`demos.episode_seed`, `demos.choose_instruction`) in the same delayed
lock-step schedule (`delayed_lockstep.DelayedLockstep`, applied by `demos.run_episode`), with the
actions the bridge would apply (the node's gripper value clipped to [0, 1]), but call
`policy.predict` directly: many episodes in little time, and in parallel worker processes.
test/test_closed_loop.py checks that both paths apply the same actions for the same seed.
A chunked checkpoint (`action_chunk` K > 1) answers a (K, 7) plan per frame; the schedule then
executes each chunk time-aligned on the control clock (a chunk from period t's frame landing d
periods later starts at its step d; the newest chunk wins; a chunk with no step left holds),
the rule the VLA node follows with `chunk_blend: latest` (docs/chunks.md). Each frame carries
its control step (`Frame.control_step`, the episode's period), as on the node.

A sweep is a list of `SweepPoint`s (a decoding configuration plus a delay schedule); each
point runs `episodes` episodes of every task and gives a `PointReport`: success overall and per
task, verifier forwards per action, acceptance length (tokens decided per verifier forward of
the speculative modes), and with `compare_ar` the distance in bins between each action token
and the AR token for the same observation (`engine.ar.reference_tokens`), per action dimension.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from vla_spec_ros.sim.bridge_settings import check_delay
from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
from vla_spec_ros.sim.twist_to_action import ACTION_DIM
from vla_spec_ros.sim.demos import EpisodeResult, choose_instruction, episode_seed, success_rate

# Episodes per work unit handed to a worker process (a point's units run in parallel).
EPISODES_PER_UNIT = 5


@dataclass(frozen=True)
class SweepPoint:
    """One configuration of a sweep: how the policy decodes and when its actions land."""

    mode: str = 'ar'
    relax_threshold: int = 0
    tree_depth: int | None = None        # None: EngineConfig's default
    tree_top_k: int | None = None
    tree_max_nodes: int | None = None
    action_delay: int = 0
    delay_hold: str = 'previous'
    delay_frames: str = 'every'
    compare_ar: bool = False              # bin distance of every token to the AR token

    def __post_init__(self):
        check_delay(self.action_delay, self.delay_hold, self.delay_frames)

    def engine_options(self) -> dict:
        options = {'mode': self.mode, 'relax_threshold': self.relax_threshold}
        for name in ('tree_depth', 'tree_top_k', 'tree_max_nodes'):
            if getattr(self, name) is not None:
                options[name] = getattr(self, name)
        return options

    @property
    def label(self) -> str:
        text = self.mode
        if self.relax_threshold:
            text += f' r={self.relax_threshold}'
        if self.tree_depth is not None:
            text += f' tree {self.tree_depth}/{self.tree_top_k}/{self.tree_max_nodes}'
        if self.action_delay:
            text += f' d={self.action_delay}'
            if self.delay_frames != 'every':
                text += f' {self.delay_frames}'
            if self.delay_hold != 'previous':
                text += f' hold {self.delay_hold}'
        return text


@dataclass
class PointReport:
    point: SweepPoint
    episodes: list = field(default_factory=list)      # EpisodeResult, task then episode order
    success_rate: float = math.nan
    success_rate_per_task: dict = field(default_factory=dict)
    num_actions: int = 0              # policy answers (frames sent to the policy)
    num_steps: int = 0                # simulator steps
    num_forwards: int = 0             # verifier forwards
    num_verify_steps: int = 0         # speculative modes: verifier steps with a tree
    num_accepted_tokens: int = 0      # tokens decided by those steps
    num_invalid: int = 0              # answers that were no valid action (episode ended)
    model: str = ''                   # the checkpoint (folder, embedded or preset name)
    action_chunk: int = 1             # control steps per answer (K; 1: single-step)
    num_held: int = 0                 # simulator steps with a held action (no step due)
    num_chunk_steps_skipped: int = 0  # chunk steps already past when their chunk landed
    num_run_outs: int = 0             # the newest chunk had no step left: the arm held
    num_token_mismatches: int = 0     # compare_ar: tokens that differ from AR's
    # compare_ar: bin_distance_counts[dim][k] = tokens of dimension dim k bins from AR's.
    bin_distance_counts: list = field(default_factory=list)
    worker_s: float = 0.0             # summed episode wall time in the workers
    wall_s: float = 0.0               # the point's wall time

    @property
    def forwards_per_action(self) -> float:
        return self.num_forwards / self.num_actions if self.num_actions else math.nan

    @property
    def acceptance_length(self) -> float:
        if not self.num_verify_steps:
            return math.nan
        return self.num_accepted_tokens / self.num_verify_steps

    def to_dict(self) -> dict:
        out = asdict(self)
        out['episodes'] = [asdict(e) for e in self.episodes]
        out['label'] = self.point.label
        out['forwards_per_action'] = self.forwards_per_action
        out['acceptance_length'] = self.acceptance_length
        return out

    @classmethod
    def from_dict(cls, data: dict) -> 'PointReport':
        data = dict(data)
        for name in ('label', 'forwards_per_action', 'acceptance_length'):
            data.pop(name, None)
        data['point'] = SweepPoint(**data['point'])
        data['episodes'] = [EpisodeResult(**e) for e in data['episodes']]
        return cls(**data)


# ---- worker side ----------------------------------------------------------------------------

_POLICIES: dict = {}
_ENVS: dict = {}       # (task, image_size, camera, max_steps) -> MetaWorldTask, per process


def _worker_init(threads: int) -> None:
    import torch
    torch.set_num_threads(threads)


def _policy(model: str, options: tuple, draft_path: str | None):
    key = (model, options, draft_path)
    if key not in _POLICIES:
        from vla_spec_ros.policy import VLAPolicy
        values = dict(options)
        if values['mode'] in ('spec', 'pipeline_spec'):
            values['draft_path'] = draft_path
        _POLICIES.clear()          # one configuration at a time per worker
        _POLICIES[key] = VLAPolicy.from_pretrained(model, **values)
    return _POLICIES[key]


def bridge_action(action: np.ndarray) -> np.ndarray:
    """The 7-dim action the bridge applies for a node action (or each step of a (K, 7) chunk):
    the gripper clipped to [0, 1] (the node's gripper convention in
    `bridge_settings.matched_command_parameters`)."""
    out = np.array(action, dtype=np.float64)
    out[..., ACTION_DIM - 1] = np.clip(out[..., ACTION_DIM - 1], 0.0, 1.0)
    return out


def predict_at(policy, image, instruction: str, unnorm_key, control_step: int):
    """`policy.predict` for a frame taken at `control_step` (`Frame.control_step`: a chunked
    model's drafter shifts the previous chunk by the steps between frames)."""
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.policy import PREDICT_STREAM
    engine = policy.engine
    request_id = engine.submit(Frame(image, instruction, unnorm_key, PREDICT_STREAM,
                                     control_step=int(control_step)))
    for finished in engine.run_until_idle():
        if finished.request_id == request_id:
            if finished.error is not None:
                raise RuntimeError(f'inference failed: {finished.error}')
            return finished.result
    raise RuntimeError('engine finished without producing the requested action')


def run_unit(unit: dict) -> dict:
    """Episodes `first .. first + count - 1` of one task at one point (in this process)."""
    from vla_spec_ros.engine.ar import reference_tokens
    from vla_spec_ros.engine.result import Frame
    from vla_spec_ros.sim.metaworld_env import get_task, make_env

    point = SweepPoint(**unit['point'])
    options = dict(unit['engine_options'], **point.engine_options())
    policy = _policy(unit['model'], tuple(sorted(options.items())), unit['draft_path'])
    key, task = unit['unnorm_key'], get_task(unit['task'])
    runner = policy.engine.runner
    tokenizer = runner.codec        # is_action_token, token_to_bin (action_codec.py)
    chunk = int(policy.model_config.action_chunk)
    out = {'episodes': [], 'num_actions': 0, 'num_steps': 0, 'num_forwards': 0,
           'num_verify_steps': 0, 'num_accepted_tokens': 0, 'num_invalid': 0,
           'num_token_mismatches': 0, 'bin_distances': [], 'worker_s': 0.0,
           'action_chunk': chunk, 'num_held': 0, 'num_chunk_steps_skipped': 0,
           'num_run_outs': 0, 'actions': [], 'tokens': [], 'sources': []}

    def act(image, instruction, period):
        if chunk > 1:
            result = predict_at(policy, image, instruction, key, period)
        else:           # single-step: exactly the path the bridge comparison tests
            result = policy.predict(image, instruction, key)
        stats = result.stats
        out['num_actions'] += 1
        out['num_forwards'] += int(stats['forward_passes'])
        if policy.config.is_speculative:
            out['num_verify_steps'] += len(stats['accepted_lengths'])
            out['num_accepted_tokens'] += int(sum(stats['accepted_lengths']))
        if unit['keep_actions']:
            out['tokens'][-1].append(list(result.tokens))
        if point.compare_ar:
            (ref,) = reference_tokens(policy.engine.runner, [Frame(image, instruction, key)],
                                      policy.config)
            row = []
            for token, expected in zip(result.tokens, ref):
                if tokenizer.is_action_token(token) and tokenizer.is_action_token(expected):
                    row.append(abs(tokenizer.token_to_bin(token)
                                   - tokenizer.token_to_bin(expected)))
                else:
                    row.append(-1 if token != expected else 0)
                out['num_token_mismatches'] += int(token != expected)
            out['bin_distances'].append(row)
        if not result.is_valid:
            out['num_invalid'] += 1
            return None
        return bridge_action(result.action)

    delay = DelayedLockstep(point.action_delay, point.delay_hold, point.delay_frames)
    # One environment per task and process, kept (like the bridge node's): creating one costs
    # about a second; every episode starts from env.reset(seed).
    env_key = (task.name, policy.model_config.image_size, unit['camera'], unit['max_steps'])
    if env_key not in _ENVS:
        _ENVS[env_key] = make_env(task.name, seed=unit['seed'], image_size=env_key[1],
                                  camera=env_key[2], max_steps=env_key[3])
    env = _ENVS[env_key]
    from vla_spec_ros.sim.demos import run_episode
    for episode in range(unit['first'], unit['first'] + unit['count']):
        ep_seed = episode_seed(unit['seed'], task.name, episode)
        applied, sources = [], []
        out['actions'].append(applied)
        out['sources'].append(sources)
        out['tokens'].append([])

        def on_step(t, a, fresh, applied=applied, sources=sources):
            applied.append(a.tolist())
            sources.append(delay.source)
        start = time.perf_counter()
        result, _, _ = run_episode(
            env, act, ep_seed, choose_instruction(task, ep_seed), delay=delay,
            on_step=on_step if unit['keep_actions'] else None, with_period=True)
        out['worker_s'] += time.perf_counter() - start
        out['num_steps'] += result.num_steps
        out['num_held'] += delay.num_held
        out['num_chunk_steps_skipped'] += delay.num_chunk_steps_skipped
        out['num_run_outs'] += delay.num_run_outs
        out['episodes'].append(asdict(result))
    if not unit['keep_actions']:
        for name in ('actions', 'tokens', 'sources'):
            out.pop(name)
    return out


# ---- driver ---------------------------------------------------------------------------------

def _units(point: SweepPoint, tasks, episodes: int, common: dict) -> list[dict]:
    units = []
    for task in tasks:
        for first in range(0, episodes, EPISODES_PER_UNIT):
            units.append(dict(common, point=asdict(point), task=task, first=first,
                              count=min(EPISODES_PER_UNIT, episodes - first)))
    return units


def _merge(report: PointReport, part: dict) -> None:
    report.episodes.extend(EpisodeResult(**e) for e in part['episodes'])
    report.action_chunk = part['action_chunk']
    for name in ('num_actions', 'num_steps', 'num_forwards', 'num_verify_steps',
                 'num_accepted_tokens', 'num_invalid', 'num_token_mismatches', 'num_held',
                 'num_chunk_steps_skipped', 'num_run_outs'):
        setattr(report, name, getattr(report, name) + part[name])
    report.worker_s += part['worker_s']
    for row in part['bin_distances']:
        if not report.bin_distance_counts:
            report.bin_distance_counts = [[] for _ in row]
        for dim, distance in enumerate(row):
            if distance < 0:        # a non-action token: counted as a mismatch only
                continue
            counts = report.bin_distance_counts[dim]
            counts.extend([0] * (distance + 1 - len(counts)))
            counts[distance] += 1


def run_sweep(points, tasks, episodes: int, *, model: str = 'metaworld-demo',
              unnorm_key: str = 'metaworld_scripted', seed: int = 1000, max_steps: int = 150,
              camera: str = 'corner4', draft_path: str | None = None, workers: int = 1,
              threads: int = 1, progress: bool = True, desc: str = '',
              keep_actions: bool = False, engine_options: dict | None = None
              ) -> list[PointReport]:
    """Every point over `episodes` episodes of each task; `workers` > 1 runs a point's work
    units in that many processes (each with `threads` torch threads). One tqdm bar per point.
    `engine_options` (dtype, device, restrict_to_action_tokens, ...) apply to every point.

    A chunked `model` (action_chunk > 1) executes its chunks time-aligned (module doc).

    `keep_actions` (tests): the parts' applied actions and tokens per episode are returned in
    `report.details`, and per episode the (frame period, chunk step) each applied action came
    from (None: a hold; `DelayedLockstep.source`) in `report.step_sources` (not serialised)."""
    if not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f'episodes: expected a positive int, got {episodes!r}')
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f'workers: expected a positive int, got {workers!r}')
    common = dict(model=model, unnorm_key=unnorm_key, seed=int(seed), max_steps=int(max_steps),
                  camera=camera, draft_path=draft_path, keep_actions=keep_actions,
                  engine_options=dict(engine_options or {}))
    pool = None
    if workers > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        os.environ.setdefault('MUJOCO_GL', 'osmesa')
        pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context('spawn'),
                                   initializer=_worker_init, initargs=(threads,))
    else:
        _worker_init(threads)
    reports = []
    try:
        for point in points:
            reports.append(_run_point(point, tasks, episodes, common, pool, progress, desc))
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        _POLICIES.clear()
        for env in _ENVS.values():
            env.close()
        _ENVS.clear()
    return reports


def _run_point(point, tasks, episodes, common, pool, progress, desc) -> PointReport:
    units = _units(point, tasks, episodes, common)
    report = PointReport(point, model=common['model'])
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(tasks) * episodes, desc=f'{desc}{point.label}', unit='episode',
                   leave=True, dynamic_ncols=True)
    start = time.perf_counter()
    parts: list = [None] * len(units)
    num_success = num_done = 0

    def record(index, part):
        nonlocal num_success, num_done
        parts[index] = part
        num_done += len(part['episodes'])
        num_success += sum(e['is_success'] for e in part['episodes'])
        if bar is not None:
            bar.update(len(part['episodes']))
            bar.set_postfix(success=f'{num_success}/{num_done}')
    try:
        if pool is None:
            for index, unit in enumerate(units):
                record(index, run_unit(unit))
        else:
            from concurrent.futures import as_completed
            futures = {pool.submit(run_unit, unit): i for i, unit in enumerate(units)}
            for future in as_completed(futures):
                record(futures[future], future.result())
    finally:
        if bar is not None:
            bar.close()
    for part in parts:             # task then episode order, whatever finished first
        _merge(report, part)
    if common['keep_actions']:
        report.details = [(a, t) for part in parts for a, t in zip(part['actions'],
                                                                   part['tokens'])]
        report.step_sources = [s for part in parts for s in part['sources']]
    report.wall_s = time.perf_counter() - start
    report.success_rate = success_rate(report.episodes)
    report.success_rate_per_task = {
        t: success_rate([e for e in report.episodes if e.task_name == t]) for t in
        dict.fromkeys(e.task_name for e in report.episodes)}
    return report


def delay_points(delays, hold: str = 'previous', one_in_flight_delays=None,
                 mode: str = 'ar') -> list[SweepPoint]:
    """The delay curve: every delay with every frame answered, then the delays of
    `one_in_flight_delays` (default: those >= 2, where the schedules differ) with one frame in
    flight."""
    if one_in_flight_delays is None:
        one_in_flight_delays = [d for d in delays if d >= 2]
    return ([SweepPoint(mode=mode, action_delay=d, delay_hold=hold) for d in delays]
            + [SweepPoint(mode=mode, action_delay=d, delay_hold=hold,
                          delay_frames='one_in_flight') for d in one_in_flight_delays])


def relax_points(thresholds, tree: tuple[int, int, int], mode: str = 'spec') -> list[SweepPoint]:
    """The relaxation sweep: `mode` with draft tree (depth, top_k, max_nodes) at every r, each
    token compared with AR's."""
    depth, top_k, max_nodes = tree
    return [SweepPoint(mode=mode, relax_threshold=r, tree_depth=depth, tree_top_k=top_k,
                       tree_max_nodes=max_nodes, compare_ar=True) for r in thresholds]


__all__ = ['SweepPoint', 'PointReport', 'run_sweep', 'run_unit', 'delay_points',
           'relax_points', 'bridge_action', 'predict_at', 'EPISODES_PER_UNIT']
