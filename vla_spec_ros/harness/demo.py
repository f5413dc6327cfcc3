"""`vla-spec demo`: what the package's two techniques do for real-time control, on the embedded
Meta-World model.

Parts (`--parts`, default `stream,lockstep,speed,delay`; `--full` adds `relax` and sets 20
episodes per task everywhere):

- stream: the speed measurement. Every decoding mode behind the real ROS 2 node, fed by a
  camera that publishes consecutive control steps of the scripted expert's episodes at
  `--stream-hz` for `--stream-seconds` (streaming.py): frames answered, frame -> twist latency
  p50 / p99 and actions/s; the Hugging Face baseline model only at the same rate on the same
  frames (it is not a node mode). The speculative modes draft with the engine's default
  drafter unless `--draft-path` says otherwise; the default configuration is labelled.
- lockstep: every decoding mode drives the simulated arm through the real ROS 2 node and the
  simulator bridge in lock-step (closed_loop.run_closed_loop): success rate, and whether each
  strict mode (r = 0) followed AR's trajectories episode for episode. Refused for a chunked
  model (`action_chunk` > 1): the node publishes a chunk's steps on its own clock, one per
  control period, while lock-step steps the arm once per answered frame, so the two disagree
  on which step the arm executes; the delay part measures chunked models (time-aligned, in
  process) and `--sim-mode realtime` runs them through the node. Lock-step has no camera
  (a frame exists only once the previous action was applied), so pipelining has nothing to
  overlap there: this part measures success, not speed. With `--sim-mode realtime` the bridge
  steps the arm on its clock at `--control-rate-hz` with the newest command, and
  `--camera-delays 0,1,2` repeats the part with frames published d control periods after
  capture (stamp kept: the node executes a chunk time-aligned, a single-step action lands d
  periods late); `--lockstep-models A,B` runs the part for several checkpoints, e.g. the
  single-step and the chunked embedded models side by side (docs/chunks.md).
- speed: model only, on consecutive control steps. `vla-spec bench --frames-from
  metaworld-episodes` rows (actions/s and the ratio to the Hugging Face AR baseline measured in
  the same run, verifier forwards per action), and each mode fed from a camera at each
  `--rates` rate (speed.paced_latency): observation -> action latency, and whether it keeps up.
- delay: success rate against action delay d (in control periods), in delayed lock-step
  (delayed_lockstep.DelayedLockstep): deterministic and independent of this machine's speed. AR's
  actions (the strict modes give the same tokens); every frame answered d periods later, and,
  for d >= 2, one frame in flight (a model that is busy skips frames). Each mode's streaming
  latency on the node is placed on that curve (d = ceil(latency * rate), one frame in flight
  unless it answered (nearly) every camera frame), beside its model-only latency at each rate
  and the OpenVLA-7B latencies recorded on an H100 (demo_results.reference_7b; not measured by
  this demo). `--delay-models A,B` runs the same curve for several checkpoints, e.g. the
  single-step `metaworld-demo` beside the chunked `metaworld-demo-chunk4`, and reports them side
  by side; the first one's curve is the one the modes are placed on. A chunked model executes
  its chunks time-aligned (the chunk of period t's frame lands at t + d and starts at its step
  d, the newest chunk wins, a chunk with no step left holds: delayed_lockstep module doc,
  docs/chunks.md).
- relax: the relaxation trade-off: `spec` with a draft tree whose acceptance is below its
  ceiling (`--relax-tree`, default depth 6, top-k 1, 7 nodes), success rate, acceptance length
  and verifier forwards per action at every r, and the distance in bins between each relaxed
  token and the AR token for the same observation, per action dimension.

The delay and relax sweeps run in process (inprocess.py: the same episodes, schedule and
actions as through the bridge, tested), in `--workers` processes. Results go to
`<out>/demo-<timestamp>.{json,md}` and plots `-delay.png`, `-relax.png`; `--report FILE.json`
prints and plots a recorded run again. matplotlib is optional (without it, no plots).

This file holds the options and the running of each part; demo_report.py the tables of a
record, demo_results.py its files and plots.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from vla_spec_ros.config import DTYPES, MODES
from vla_spec_ros.sim.bridge_settings import DELAY_HOLDS
from vla_spec_ros.harness.demo_results import (load_record, print_report, reference_7b,
                                               write_results)
from vla_spec_ros.harness.streaming import DEFAULT_STREAM_HZ, DEFAULT_STREAM_SECONDS
from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES, get_task

SPECULATIVE_MODES = ('spec', 'pipeline_spec')
PARTS = ('stream', 'lockstep', 'speed', 'delay', 'relax')
DEFAULT_PARTS = ('stream', 'lockstep', 'speed', 'delay')
MAX_STREAM_SECONDS = 600.0
FULL_EPISODES = 20
IN_PROCESS_PATH = ('in process: sim.demos.run_episode with delayed_lockstep.DelayedLockstep, '
                   'policy.predict (the same actions as the ROS bridge path, '
                   'test/test_closed_loop.py)')


def add_arguments(parser) -> None:
    parser.add_argument('--model', default='metaworld-demo',
                        help='checkpoint folder, embedded model or preset name')
    parser.add_argument('--tasks', default=','.join(DEFAULT_TASK_NAMES),
                        help='comma-separated Meta-World task names')
    parser.add_argument('--parts', default=','.join(DEFAULT_PARTS),
                        help=f'comma-separated parts to run, from {",".join(PARTS)}')
    parser.add_argument('--full', action='store_true',
                        help=f'every part, {FULL_EPISODES} episodes per task each (about two '
                        'hours on 2 CPU cores)')
    parser.add_argument('--episodes', type=int, default=None,
                        help='lock-step episodes per task (default 1; --full 20)')
    parser.add_argument('--modes', default='ar,pipeline,spec,pipeline_spec',
                        help='decoding modes of the stream, lock-step and speed parts')
    parser.add_argument('--stream-hz', type=float, default=DEFAULT_STREAM_HZ,
                        help='stream part: the camera rate (Hz)')
    parser.add_argument('--stream-seconds', type=float, default=DEFAULT_STREAM_SECONDS,
                        help='stream part: timed seconds per mode (after a 1.5 s warm-up)')
    parser.add_argument('--relax-thresholds', default='0',
                        help='lock-step part: relaxation thresholds (bins) of the speculative '
                        'modes')
    parser.add_argument('--sim-mode', default='lockstep', choices=['lockstep', 'realtime'],
                        help='lock-step part: lockstep (deterministic) or realtime')
    parser.add_argument('--control-rate-hz', type=float, default=10.0,
                        help='lock-step part: the nodes\' control period (realtime: its rate)')
    parser.add_argument('--camera-delays', default='0',
                        help='lock-step part with --sim-mode realtime: camera delays in control '
                        'periods (frames published d periods after capture, stamp kept)')
    parser.add_argument('--lockstep-models', default=None, metavar='A,B',
                        help='lock-step part: checkpoints run one after the other and reported '
                        'side by side, e.g. metaworld-demo,metaworld-demo-chunk4 with '
                        '--sim-mode realtime (default: --model)')
    parser.add_argument('--delays', default='0,1,2,4,8',
                        help='delay part: action delays in control periods')
    parser.add_argument('--one-in-flight-delays', default='auto',
                        help='delay part: delays also run with one frame in flight (auto: '
                        'those of --delays >= 2, where the schedules differ; none: no such run)')
    parser.add_argument('--delay-models', default=None, metavar='A,B',
                        help='delay part: checkpoints whose curves are run and reported side by '
                        'side, e.g. metaworld-demo,metaworld-demo-chunk4 (default: --model; '
                        'the first one\'s curve places the modes\' latencies)')
    parser.add_argument('--delay-hold', default='previous', choices=list(DELAY_HOLDS),
                        help='delay part: what the arm does until an action lands')
    parser.add_argument('--delay-episodes', type=int, default=None,
                        help='delay part: episodes per task and delay (default 1; --full 20)')
    parser.add_argument('--rates', default='10,30,60',
                        help='control rates (Hz) at which modes are placed on the delay curve '
                        '(the middle one is plotted on it)')
    parser.add_argument('--speed-frames', type=int, default=30,
                        help='speed part: timed frames per mode')
    parser.add_argument('--relax-sweep', default='0,2,8,32,64,128,255',
                        help='relax part: relaxation thresholds r (bins)')
    parser.add_argument('--relax-tree', default='6,1,7',
                        help='relax part: draft tree depth,top_k,max_nodes')
    parser.add_argument('--relax-episodes', type=int, default=None,
                        help='relax part: episodes per task and r (default 2; --full 20)')
    parser.add_argument('--workers', type=int, default=min(2, os.cpu_count() or 1),
                        help='processes for the in-process sweeps (delay, relax)')
    parser.add_argument('--max-steps', type=int, default=150)
    parser.add_argument('--seed', type=int, default=1000,
                        help='base seed of the episodes; the shipped model\'s demonstrations '
                        'used seed 0, so the default evaluates on unseen placements')
    parser.add_argument('--dtype', default='float32', choices=list(DTYPES))
    parser.add_argument('--device', default='cpu', help='cpu or cuda[:N]')
    parser.add_argument('--draft-path', default=None,
                        help='drafter of the speculative modes (default: the engine\'s, each '
                        'stream\'s previous action); "checkpoint" for the model\'s draft/ '
                        'EAGLE head, a draft head folder or "random"')
    parser.add_argument('--unnorm-key', default=None,
                        help='default: metaworld_scripted, or the checkpoint\'s only key')
    parser.add_argument('--restrict-to-action-tokens', action='store_true',
                        help='greedy over action tokens only (needed by random-weight models)')
    parser.add_argument('--threads', type=int, default=1,
                        help='torch CPU threads (1: the simulator and DDS need the other '
                        'cores, and a small model gains nothing from more)')
    parser.add_argument('--out', default='results/demo', help='results folder')
    parser.add_argument('--expert', action='store_true',
                        help='lock-step part: also measure the scripted expert on the same seeds')
    parser.add_argument('--verbose', action='store_true',
                        help='show the ROS nodes\' log lines (default: errors only; the demo '
                        'reports held or republished frames itself)')
    parser.add_argument('--report', default=None, metavar='FILE.json',
                        help='print and plot a recorded demo-*.json again (runs nothing)')
    parser.add_argument('--latencies-from', default=None, metavar='FILE.json',
                        help='with --report: place the latencies of another recorded run (its '
                        'stream, speed and lock-step parts) on this run\'s curves; written '
                        'beside the report as <name>-placed-<other name>.*')


# ---- options ---------------------------------------------------------------------------------

def _split(text: str, name: str) -> list[str]:
    items = [t.strip() for t in text.split(',') if t.strip()]
    if not items:
        raise ValueError(f'{name}: expected a comma-separated list, got {text!r}')
    return items


def _ints(text: str, name: str, low: int, high: int) -> list[int]:
    try:
        values = [int(v) for v in _split(text, name)]
    except ValueError:
        raise ValueError(f'{name}: expected integers, got {text!r}') from None
    if any(not low <= v <= high for v in values):
        raise ValueError(f'{name}: expected values in [{low}, {high}], got {values}')
    return _check_unique(values, name)


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(v) for v in _split(text, name)]
    except ValueError:
        raise ValueError(f'{name}: expected numbers, got {text!r}') from None
    return _check_unique(values, name)


def _check_unique(items: list, name: str) -> list:
    """`items` unchanged; a repeated entry would run (and report) the same rows twice."""
    repeated = sorted({str(x) for x in items if items.count(x) > 1})
    if repeated:
        raise ValueError(f'{name}: repeated {repeated}')
    return items


def configurations(modes: list[str], thresholds: list[int]) -> list[tuple[str, int]]:
    """(mode, r) pairs: every threshold for the speculative modes, r = 0 for the others."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f'--modes: unknown {unknown}; choose from {list(MODES)}')
    _check_unique(modes, '--modes')
    if any(r < 0 or r > 255 for r in thresholds):
        raise ValueError(f'--relax-thresholds: expected bins in [0, 255], got {thresholds}')
    _check_unique(thresholds, '--relax-thresholds')
    return [(m, r) for m in modes for r in (thresholds if m in SPECULATIVE_MODES else [0])]


def _positive(value, name: str, default: int) -> int:
    value = default if value is None else value
    if not isinstance(value, int) or value < 1:
        raise ValueError(f'{name}: must be >= 1, got {value!r}')
    return value


def resolve_options(args) -> dict:
    """Every option checked and defaulted (ValueError naming the option) before anything
    loads; the plan of the run."""
    from vla_spec_ros.harness.closed_loop import check_control_rate, check_max_steps
    parts = PARTS if args.full else tuple(_check_unique(_split(args.parts, '--parts'),
                                                        '--parts'))
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f'--parts: unknown {unknown}; choose from {list(PARTS)}')
    full = FULL_EPISODES if args.full else None

    def count(value, name, default):
        return _positive(value if value is not None else full, name, default)
    tasks = _check_unique([get_task(t).name for t in _split(args.tasks, '--tasks')], '--tasks')
    thresholds = _ints(args.relax_thresholds, '--relax-thresholds', 0, 255)
    modes = _split(args.modes, '--modes')
    configs = configurations(modes, thresholds)
    tree = _ints(args.relax_tree, '--relax-tree', 1, 512)
    if len(tree) != 3:
        raise ValueError(f'--relax-tree: expected depth,top_k,max_nodes, got {args.relax_tree!r}')
    from vla_spec_ros.config import EngineConfig
    try:
        EngineConfig(tree_depth=tree[0], tree_top_k=tree[1], tree_max_nodes=tree[2])
    except ValueError as exc:
        raise ValueError(f'--relax-tree: {exc}') from None
    delays = _ints(args.delays, '--delays', 0, 100)
    if args.one_in_flight_delays == 'auto':
        one_in_flight = [d for d in delays if d >= 2]
    elif args.one_in_flight_delays == 'none':
        one_in_flight = []
    else:
        one_in_flight = _ints(args.one_in_flight_delays, '--one-in-flight-delays', 2, 100)
    camera_delays = _ints(getattr(args, 'camera_delays', '0'), '--camera-delays', 0, 100)
    if camera_delays != [0] and args.sim_mode != 'realtime':
        raise ValueError('--camera-delays: applies to --sim-mode realtime only (lock-step waits '
                         'for every answer; see --parts delay)')
    rates = _floats(args.rates, '--rates')
    for rate in rates:
        check_control_rate(rate, '--rates')
    stream_hz = check_control_rate(args.stream_hz, '--stream-hz')
    stream_seconds = args.stream_seconds
    if (isinstance(stream_seconds, bool) or not isinstance(stream_seconds, (int, float))
            or not 1.0 <= stream_seconds <= MAX_STREAM_SECONDS):
        raise ValueError(f'--stream-seconds: expected seconds in [1, {MAX_STREAM_SECONDS:g}], '
                         f'got {stream_seconds!r}')
    plan = {
        'parts': list(parts), 'tasks': tasks, 'modes': modes, 'configs': configs,
        'episodes': count(args.episodes, '--episodes', 1),
        'delay_episodes': count(args.delay_episodes, '--delay-episodes', 1),
        'relax_episodes': count(args.relax_episodes, '--relax-episodes', 2),
        'delays': delays, 'one_in_flight_delays': one_in_flight, 'relax_sweep': _ints(
            args.relax_sweep, '--relax-sweep', 0, 255), 'relax_tree': tree, 'rates': rates,
        'control_rate_hz': check_control_rate(args.control_rate_hz, '--control-rate-hz'),
        'max_steps': check_max_steps(args.max_steps, '--max-steps'),
        'workers': _positive(args.workers, '--workers', 1),
        'speed_frames': _positive(args.speed_frames, '--speed-frames', 1),
        'stream_hz': stream_hz, 'stream_seconds': float(stream_seconds),
        'threads': _positive(args.threads, '--threads', 1),
        'delay_models': _check_unique(
            _split(args.delay_models, '--delay-models') if getattr(args, 'delay_models', None)
            else [args.model], '--delay-models'),
        'lockstep_models': _check_unique(
            _split(args.lockstep_models, '--lockstep-models')
            if getattr(args, 'lockstep_models', None) else [args.model], '--lockstep-models'),
        'camera_delays': camera_delays,
    }
    return plan


def action_chunk(model: str) -> int:
    """Control steps per answer of a checkpoint (its config.json `action_chunk`, default 1),
    without loading it."""
    import json

    from vla_spec_ros.policy import resolve_checkpoint
    config = json.loads((resolve_checkpoint(model) / 'config.json').read_text())
    return int(config.get('action_chunk') or 1)


def check_lockstep_model(model: str, sim_mode: str) -> None:
    """Lock-step through the node needs a single-step model (module doc, lockstep part)."""
    chunk = action_chunk(model)
    if chunk > 1 and sim_mode == 'lockstep':
        raise ValueError(
            f'--parts lockstep: {model} is a chunked model (action_chunk {chunk}); lock-step '
            'steps the arm once per answered frame while the node publishes a chunk\'s steps on '
            'its clock, one per control period. Run its success against delay in process '
            '(--parts delay: chunks executed time-aligned) or through the node with '
            '--sim-mode realtime')


def _load_average() -> list | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    info = {'platform': platform.platform(), 'python': platform.python_version(),
            'processor': platform.processor() or platform.machine(),
            'cpu_count': os.cpu_count(), 'MUJOCO_GL': os.environ.get('MUJOCO_GL')}
    for name in ('torch', 'metaworld', 'mujoco', 'rclpy'):
        try:
            info[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            info[name] = None
    try:
        import torch
        info['torch_threads'] = torch.get_num_threads()
        info['cuda'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        info['cuda'] = None
    try:
        info['load_avg_at_start'] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    info['git'] = _git_state()
    return info


def _git_state() -> str | None:
    """The checkout's commit, and how many files differ from it (None outside a checkout)."""
    import subprocess
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=root, text=True,
                                capture_output=True, timeout=10, check=True).stdout.strip()
        changed = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'],
                                 cwd=root, text=True, capture_output=True, timeout=10,
                                 check=True).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + (f' + {len(changed)} changed files' if changed else '')


# ---- running ---------------------------------------------------------------------------------

def _expert_rates(task_names, episodes: int, seed: int, max_steps: int) -> dict:
    from vla_spec_ros.sim.demos import evaluate_scripted
    per_task = {t: evaluate_scripted(t, episodes, seed, image_size=64, max_steps=max_steps)
                for t in task_names}
    return {'success_rate': sum(per_task.values()) / len(per_task), 'per_task': per_task,
            'num_episodes': episodes * len(per_task)}


def _run_lockstep(args, plan, unnorm_key, cache) -> dict:
    """One row per (model, mode, r, camera delay), in that order; each row names its model
    and action_chunk (the first model's rows are the ones placed on the delay curve)."""
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    lock = {'episodes': plan['episodes'], 'sim_mode': args.sim_mode,
            'control_rate_hz': plan['control_rate_hz'], 'expert': None, 'rows': [],
            'models': plan['lockstep_models'], 'camera_delays': plan['camera_delays']}
    if args.expert:
        lock['expert'] = _expert_rates(plan['tasks'], plan['episodes'], args.seed,
                                       plan['max_steps'])
    for model in plan['lockstep_models']:
        key = unnorm_key if model == args.model else _resolve_unnorm_key(
            VLAPolicy.from_pretrained(model), args.unnorm_key)
        for mode, r in plan['configs']:
            policy = VLAPolicy.from_pretrained(
                model, mode=mode, relax_threshold=r, dtype=args.dtype, device=args.device,
                draft_path=args.draft_path if mode in SPECULATIVE_MODES else None,
                restrict_to_action_tokens=args.restrict_to_action_tokens)
            for camera_delay in plan['camera_delays']:
                label = f'{mode} r={r}' + (f' d={camera_delay}' if args.sim_mode == 'realtime'
                                           else '')
                if len(plan['lockstep_models']) > 1:
                    label = f'{model} {label}'
                report = _closed_loop_row(args, plan, policy, key, camera_delay, label)
                lock['rows'].append(dict(report.to_dict(), model=model,
                                         load_avg_at_end=_load_average()))
                if 'save_part' in cache:       # a long run keeps each row
                    cache['save_part']('lockstep', lock)
    return lock


def _closed_loop_row(args, plan, policy, unnorm_key, camera_delay, label):
    """One closed_loop.run_closed_loop run with a progress bar; its ClosedLoopReport."""
    from tqdm import tqdm

    from vla_spec_ros.harness.closed_loop import run_closed_loop
    bar = tqdm(total=plan['episodes'] * len(plan['tasks']), desc=f'{args.sim_mode} {label}',
               unit='episode', dynamic_ncols=True)
    wins = []

    def on_episode(result, log):
        wins.append(result.is_success)
        bar.update(1)
        bar.set_postfix(success=f'{sum(wins)}/{len(wins)}')
    try:
        report = run_closed_loop(policy, plan['tasks'], plan['episodes'], seed=args.seed,
                                 sim_mode=args.sim_mode, control_rate_hz=plan['control_rate_hz'],
                                 max_steps=plan['max_steps'], unnorm_key=unnorm_key,
                                 on_episode=on_episode, camera_delay=camera_delay,
                                 log_level=None if args.verbose else 'error')
    finally:
        bar.close()
    if report.num_timeouts or report.num_republished_frames or report.num_unanswered:
        print(f'[{label}] {report.num_timeouts} episodes timed out, '
              f'{report.num_unanswered} ended by an unanswered frame, '
              f'{report.num_republished_frames} frames republished: the VLA node held '
              'some frames (invalid actions? run with --verbose)')
    if report.num_late_ticks:
        print(f'[{label}] {report.num_late_ticks} simulator ticks came late (longest gap '
              f'{report.max_tick_gap_ms:.0f} ms): the machine did not keep '
              f'{plan["control_rate_hz"]:g} Hz')
    return report


def _camera_frames(args, plan, unnorm_key, cache: dict) -> list:
    """The stream's frames (consecutive control steps, streaming.stream_frames), rendered once
    for the stream and speed parts; enough for the stream's warm-up and timed frames and for
    the speed part's paced rows."""
    if 'frames' not in cache:
        from vla_spec_ros.harness import streaming
        from vla_spec_ros.policy import VLAPolicy
        size = VLAPolicy.from_pretrained(args.model).model_config.image_size
        warmup, timed = streaming.frame_counts(plan['stream_hz'], plan['stream_seconds'])
        needed = max(warmup + timed if 'stream' in plan['parts'] else 0,
                     plan['speed_frames'] + 3)
        cache['frames'] = streaming.stream_frames(plan['tasks'], needed, size, args.seed,
                                                  unnorm_key)
    return cache['frames']


def _run_stream(args, plan, unnorm_key, cache) -> dict:
    from tqdm import tqdm

    from vla_spec_ros.harness import streaming
    frames = _camera_frames(args, plan, unnorm_key, cache)
    bar = tqdm(total=len(plan['modes']) + 1, desc=f'streaming at {plan["stream_hz"]:g} Hz',
               unit='mode', dynamic_ncols=True)

    def on_row(row):
        bar.update(1)
        bar.set_postfix(mode=row['mode'], p50=f"{row['latency_p50_ms']:.0f} ms",
                        answered=f"{100 * row['answered_fraction']:.0f}%")
    try:
        return streaming.run_stream(
            args.model, plan['modes'], plan['tasks'], rate_hz=plan['stream_hz'],
            seconds=plan['stream_seconds'], seed=args.seed, unnorm_key=unnorm_key,
            dtype=args.dtype, device=args.device, draft_path=args.draft_path,
            restrict_to_action_tokens=args.restrict_to_action_tokens,
            log_level=None if args.verbose else 'error', frames=frames, on_row=on_row)
    finally:
        bar.close()


def _run_speed(args, plan, unnorm_key, cache) -> dict:
    from tqdm import tqdm

    from vla_spec_ros.harness import speed
    from vla_spec_ros.harness.streaming import mode_drafter
    from vla_spec_ros.policy import VLAPolicy
    steps = tqdm(total=1 + len(plan['rates']), desc='model-only speed', unit='part',
                 dynamic_ncols=True)
    try:
        rows = speed.model_speed_rows(args.model, plan['modes'], plan['speed_frames'],
                                      args.device, args.dtype, args.draft_path,
                                      frame_source=speed.BENCH_FRAME_SOURCE)
        steps.update(1)
        policy = VLAPolicy.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                           restrict_to_action_tokens=(
                                               args.restrict_to_action_tokens))
        frames = [dataclasses.replace(f, stream_id=speed.PACED_STREAM)
                  for f in _camera_frames(args, plan, unnorm_key, cache)]
        paced = {}
        for rate in plan['rates']:
            paced[str(rate)] = speed.paced_rows(policy, ['hf'] + plan['modes'], frames, rate,
                                                plan['speed_frames'], args.draft_path)
            steps.update(1)
    finally:
        steps.close()
    return {'bench_rows': [asdict(r) for r in rows], 'bench_frames': plan['speed_frames'],
            'bench_frame_source': speed.BENCH_FRAME_SOURCE,
            'drafter': {m: mode_drafter(m, args.draft_path) for m in plan['modes']},
            'paced_frames': 'the first frames of the stream part\'s camera (consecutive '
                            'control steps)', 'paced': paced}


def _sweep_common(args, plan, unnorm_key) -> dict:
    return dict(model=args.model, unnorm_key=unnorm_key, seed=args.seed,
                max_steps=plan['max_steps'], draft_path=args.draft_path,
                workers=plan['workers'], threads=plan['threads'],
                engine_options={'dtype': args.dtype, 'device': args.device,
                                'restrict_to_action_tokens': args.restrict_to_action_tokens})


def _run_delay(args, plan, unnorm_key, cache) -> dict:
    """The delay curve of each of `plan['delay_models']`: the first one's in 'points' (the
    curve the modes are placed on), every one's in 'models' (model, action_chunk, points)."""
    from vla_spec_ros.harness import inprocess
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    points = inprocess.delay_points(plan['delays'], args.delay_hold,
                                    plan['one_in_flight_delays'])
    curves = []
    for model in plan['delay_models']:
        key = unnorm_key if model == args.model else _resolve_unnorm_key(
            VLAPolicy.from_pretrained(model), args.unnorm_key)
        common = dict(_sweep_common(args, plan, key), model=model)
        chunk = action_chunk(model)
        label = f'delay {model}: ' if len(plan['delay_models']) > 1 else 'delay: '
        reports = inprocess.run_sweep(points, plan['tasks'], plan['delay_episodes'],
                                      desc=label, **common)
        curves.append({'model': model, 'action_chunk': chunk, 'unnorm_key': key,
                       'points': [r.to_dict() for r in reports]})
    return {'episodes': plan['delay_episodes'], 'hold': args.delay_hold, 'mode': 'ar',
            'path': IN_PROCESS_PATH, 'model': curves[0]['model'],
            'action_chunk': curves[0]['action_chunk'], 'points': curves[0]['points'],
            'models': curves}


def _run_relax(args, plan, unnorm_key, cache) -> dict:
    from vla_spec_ros.harness import inprocess
    points = inprocess.relax_points(plan['relax_sweep'], tuple(plan['relax_tree']))
    reports = inprocess.run_sweep(points, plan['tasks'], plan['relax_episodes'],
                                  desc='relax: ', **_sweep_common(args, plan, unnorm_key))
    return {'episodes': plan['relax_episodes'], 'mode': 'spec', 'tree': plan['relax_tree'],
            'path': IN_PROCESS_PATH, 'points': [r.to_dict() for r in reports]}


def _unnorm_key(args) -> str:
    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.policy import VLAPolicy
    return _resolve_unnorm_key(VLAPolicy.from_pretrained(args.model), args.unnorm_key)


def run(args) -> int:
    if args.report:            # the tables and plots again, beside the recorded JSON
        report = Path(args.report)
        record, stem = load_record(report), report.stem
        if args.latencies_from:
            other = load_record(args.latencies_from)
            if 'speed' not in other and 'stream' not in other:
                raise ValueError(f'--latencies-from: {args.latencies_from} has neither a '
                                 'speed nor a stream part')
            for part in ('stream', 'speed', 'lockstep', 'reference_7b'):
                record.pop(part, None)
                if part in other:
                    record[part] = other[part]
            record['latencies_from'] = {'file': Path(args.latencies_from).name,
                                        'command': other['command'],
                                        'created': other['created']}
            stem += f'-placed-{Path(args.latencies_from).stem}'
        paths = write_results(report.parent, record, stem)
        print_report(record, paths)
        return 0
    if args.latencies_from:
        raise ValueError('--latencies-from: only with --report')
    torch = importlib.import_module('torch')
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason

    plan = resolve_options(args)       # every option checked before anything loads
    if 'lockstep' in plan['parts']:
        for model in plan['lockstep_models']:
            check_lockstep_model(model, args.sim_mode)
    reason = sim_unavailable_reason()
    if reason is not None:
        raise ValueError(f'the simulator is unavailable: {reason}')
    torch.set_num_threads(plan['threads'])
    start = time.perf_counter()
    argv = getattr(args, 'argv', sys.argv[1:])
    record = {'command': 'vla-spec ' + ' '.join(shlex.quote(a) for a in argv),
              'created': time.strftime('%Y-%m-%d %H:%M:%S'), 'model': args.model,
              'tasks': plan['tasks'], 'seed': args.seed, 'max_steps': plan['max_steps'],
              'dtype': args.dtype, 'device': args.device, 'parts': plan['parts'],
              'machine': machine_info(), 'part_wall_s': {}}
    if 'delay' in plan['parts']:
        record['reference_7b'] = reference_7b()
    key = _unnorm_key(args)
    # Model-only first (quietest machine), then the node at the camera rate, then the ROS
    # lock-step loop, then the sweeps.
    runners = {'stream': _run_stream, 'speed': _run_speed, 'lockstep': _run_lockstep,
               'delay': _run_delay, 'relax': _run_relax}
    stem = f'demo-{time.strftime("%Y%m%d-%H%M%S")}'

    def save_part(part, value):
        """Write the record with a part still running (its rows so far)."""
        record[part] = value
        record['wall_s'] = time.perf_counter() - start
        write_results(args.out, record, stem)
    cache: dict = {'save_part': save_part}
    for part in ('speed', 'stream', 'lockstep', 'delay', 'relax'):
        if part in plan['parts']:
            part_start = time.perf_counter()
            record[part] = runners[part](args, plan, key, cache)
            record['part_wall_s'][part] = time.perf_counter() - part_start
            record['wall_s'] = time.perf_counter() - start
            paths = write_results(args.out, record, stem)   # a long run keeps each part
    try:
        record['machine']['load_avg_at_end'] = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        pass
    paths = write_results(args.out, record, stem)
    print_report(record, paths)           # its last lines: the summary
    print(f'wall time {record["wall_s"]:.0f} s')
    return 0


__all__ = ['add_arguments', 'run', 'configurations', 'resolve_options', 'machine_info',
           'action_chunk', 'check_lockstep_model']
