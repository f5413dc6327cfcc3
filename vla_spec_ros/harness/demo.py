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

After these parts, `--second-model` (default `auto`: the embedded π0-FAST model
`metaworld-demo-fast` after the default `metaworld-demo`, nothing after another model; `none`
to skip) runs the stream, speed and lockstep parts again for a
second model, AR and the default mode, through the node in real time with the ensemble blend,
as a record of its own (demo_second.py).

The delay and relax sweeps run in process (inprocess.py: the same episodes, schedule and
actions as through the bridge, tested), in `--workers` processes. Results go to
`<out>/demo-<timestamp>.{json,md}` and plots `-delay.png`, `-relax.png`; `--report FILE.json`
prints and plots a recorded run again. matplotlib is optional (without it, no plots).

This file runs each part (the runners) and the whole job (`run`); demo_options.py holds the
options and the plan of a run, demo_machine.py the machine it ran on, demo_tables.py and
demo_report.py the tables and report of a record, demo_placement.py where latencies land on
the delay curve, demo_results.py its files and plots.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from vla_spec_ros.harness.demo_machine import load_average, machine_info
from vla_spec_ros.harness.demo_options import (SPECULATIVE_MODES, action_chunk,
                                               check_lockstep_model, resolve_options)
from vla_spec_ros.harness.demo_results import (load_record, print_report, reference_7b,
                                               write_results)
from vla_spec_ros.harness.demo_rollup import format_rollup
from vla_spec_ros.harness.demo_second import (resolve_second_model, second_model_args,
                                              second_model_argv)

IN_PROCESS_PATH = ('in process: sim.demos.run_episode with delayed_lockstep.DelayedLockstep, '
                   'policy.predict (the same actions as the ROS bridge path, '
                   'test/test_closed_loop.py)')


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
                                         load_avg_at_end=load_average()))
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
                                 node_parameters={'chunk_blend': plan['chunk_blend']},
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
    from vla_spec_ros.harness.streaming import mode_drafter, model_default_draft
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
            'drafter': {m: mode_drafter(m, args.draft_path, model_default_draft(policy))
                        for m in plan['modes']},
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


def run(args, chain: list | None = None) -> int:
    """One demo pass; with a further model (`--second-model`) the next pass runs after it,
    `chain` carrying the earlier passes' records so that the last prints the roll-up."""
    chain = [] if chain is None else chain
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
    second = second_model_argv(args, plan)
    if second is not None:
        action_chunk(resolve_second_model(args))     # a checkpoint that resolves, or an error
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
    chain.append(record)
    if second is not None:
        print(f'\n# The next model: vla-spec {shlex.join(second)}\n', flush=True)
        return run(second_model_args(second), chain)
    rollup = format_rollup(chain)
    if rollup:
        print('\n' + rollup, flush=True)
    return 0


__all__ = ['run']
