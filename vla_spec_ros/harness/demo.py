"""`vla-spec demo`: what the package's two techniques do for real-time control, on the embedded
Meta-World model.

Parts (`--parts`, default `lockstep,speed,delay`; `--full` adds `relax` and sets 20 episodes
per task everywhere):

- lockstep: every decoding mode drives the simulated arm through the real ROS 2 node and the
  simulator bridge in lock-step (closed_loop.run_closed_loop): success rate, and whether each
  strict mode (r = 0) followed AR's trajectories episode for episode. Its steps/s measure the
  whole loop, simulator included; beside them the node's own rate (1 / mean frame -> command
  latency over DDS) and the model-only rate.
- speed: model only. `vla-spec bench`'s rows (actions/s and the ratio to the Hugging Face AR
  baseline measured in the same run), and each mode fed from a camera at each `--rates` rate
  (speed.paced_latency): observation -> action latency, and whether it keeps up.
- delay: success rate against action delay d (in control periods), in delayed lock-step
  (bridge_logic.DelayedLockstep): deterministic and independent of this machine's speed. AR's
  actions (the strict modes give the same tokens); every frame answered d periods later, and,
  for d >= 2, one frame in flight (a model that is busy skips frames). Each mode's latency
  (model only at each rate, and on the node) is placed on that curve: d = ceil(latency *
  rate), one frame in flight unless it answered (nearly) every camera frame.
- relax: the relaxation trade-off: `spec` with a draft tree whose acceptance is below its
  ceiling (`--relax-tree`, default depth 6, top-k 1, 7 nodes), success rate, acceptance length
  and verifier forwards per action at every r, and the distance in bins between each relaxed
  token and the AR token for the same observation, per action dimension.

The delay and relax sweeps run in process (inprocess.py: the same episodes, schedule and
actions as through the bridge, tested), in `--workers` processes. Results go to
`<out>/demo-<timestamp>.{json,md}` and plots `-delay.png`, `-relax.png`; `--report FILE.json`
prints and plots a recorded run again. matplotlib is optional (without it, no plots).
"""
from __future__ import annotations

import importlib
import json
import math
import os
import platform
import shlex
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

from vla_spec_ros.config import DTYPES, MODES
from vla_spec_ros.sim.bridge_logic import DELAY_HOLDS
from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES, get_task

SPECULATIVE_MODES = ('spec', 'pipeline_spec')
PARTS = ('lockstep', 'speed', 'delay', 'relax')
DEFAULT_PARTS = ('lockstep', 'speed', 'delay')
FULL_EPISODES = 20
# A mode "keeps up" with a camera when it answers at least this share of its frames.
KEEPS_UP_FRACTION = 0.95
IN_PROCESS_PATH = ('in process: sim.demos.run_episode with bridge_logic.DelayedLockstep, '
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
                        help='decoding modes of the lock-step and speed parts')
    parser.add_argument('--relax-thresholds', default='0',
                        help='lock-step part: relaxation thresholds (bins) of the speculative '
                        'modes')
    parser.add_argument('--sim-mode', default='lockstep', choices=['lockstep', 'realtime'],
                        help='lock-step part: lockstep (deterministic) or realtime')
    parser.add_argument('--control-rate-hz', type=float, default=10.0,
                        help='lock-step part: the nodes\' control period (realtime: its rate)')
    parser.add_argument('--delays', default='0,1,2,4,8',
                        help='delay part: action delays in control periods')
    parser.add_argument('--one-in-flight-delays', default='auto',
                        help='delay part: delays also run with one frame in flight (auto: '
                        'those of --delays >= 2, where the schedules differ; none: no such run)')
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
                        help='draft head folder or "random" (default: the model\'s draft/)')
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
                        'speed and lock-step parts) on this run\'s curves; written beside the '
                        'report as <name>-placed.*')


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
    rates = _floats(args.rates, '--rates')
    for rate in rates:
        check_control_rate(rate, '--rates')
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
        'threads': _positive(args.threads, '--threads', 1),
    }
    return plan


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
    return info


# ---- tables ----------------------------------------------------------------------------------

def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    return f'{value:.{digits}f}'


def _episodes(count: int) -> str:
    return f'{count} episode' + ('' if count == 1 else 's')


def _table(head, rows) -> str:
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines) + '\n'


def _outcomes(episodes) -> list[tuple]:
    return [(e['task_name'], e['seed'], e['is_success'], e['num_steps']) for e in episodes]


def same_as_ar(row: dict, rows: list[dict]) -> str:
    """For a strict row (r = 0): 'yes' when every episode has AR's outcome and length (the same
    trajectory in lock-step), else how many differ; '-' for AR, relaxed rows or without AR."""
    ar = next((r for r in rows if r['mode'] == 'ar'), None)
    if ar is None or row['mode'] == 'ar' or row['relax_threshold'] != 0:
        return '-'
    mine, ref = _outcomes(row['episodes']), _outcomes(ar['episodes'])
    if len(mine) != len(ref):
        return 'n/a'
    differ = sum(a != b for a, b in zip(mine, ref))
    return 'yes' if differ == 0 else f'no ({differ} differ)'


def _bench_by_mode(record) -> dict:
    return {r['mode']: r for r in (record.get('speed') or {}).get('bench_rows', [])}


def format_lockstep_table(record: dict) -> str:
    lock = record['lockstep']
    bench = _bench_by_mode(record)
    head = ['mode', 'r', 'success', 'same episodes as AR', 'lock-step steps/s (simulator-bound)',
            'node latency p50 / p99 ms', 'node actions/s', 'model-only actions/s',
            'acceptance length', 'forwards/action', 'episodes']
    rows = []
    if lock.get('expert') is not None:
        expert = lock['expert']
        rows.append(['expert', '-', _fmt(expert['success_rate'])] + ['-'] * 7
                    + [expert['num_episodes']])
    for r in lock['rows']:
        model = bench.get(r['mode'], {}).get('actions_per_s') if r['relax_threshold'] == 0 \
            else None
        rows.append([r['mode'], r['relax_threshold'], _fmt(r['success_rate']),
                     same_as_ar(r, lock['rows']), _fmt(r['actions_per_s'], 1),
                     f"{_fmt(r['latency_p50_ms'], 1)} / {_fmt(r['latency_p99_ms'], 1)}",
                     _fmt(r.get('node_actions_per_s'), 1), _fmt(model, 1),
                     _fmt(r['acceptance_length']), _fmt(r['forwards_per_action']),
                     len(r['episodes'])])
    return _table(head, rows)


def format_task_table(rows: list[dict], tasks, label) -> str:
    """Success per task, one row per configuration."""
    head = ['configuration'] + list(tasks)
    return _table(head, [[label(r)] + [_fmt(r['success_rate_per_task'].get(t)) for t in tasks]
                         for r in rows])


def format_speed_table(record: dict) -> str:
    speed = record['speed']
    rates = [str(r) for r in speed.get('paced', {})]
    head = ['mode', 'actions/s', '× HF', 'latency p50 ms (saturated)', 'forwards/action',
            'acceptance length'] + [f'@ {float(r):g} Hz: latency p50 ms, frames answered'
                                    for r in rates]
    rows = []
    for b in speed['bench_rows']:
        cells = [b['mode'], _fmt(b['actions_per_s'], 1), _fmt(b['ratio_vs_hf']),
                 _fmt(b['latency_p50_ms'], 1), _fmt(b['forwards_per_action']),
                 _fmt(b['acceptance_length'])]
        for rate in rates:
            paced = speed['paced'][rate].get(b['mode'])
            cells.append('-' if paced is None else
                         f"{_fmt(paced['latency_p50_ms'], 1)}, "
                         f"{100 * paced['answered_fraction']:.0f}%")
        rows.append(cells)
    return _table(head, rows)


def delay_curve(record: dict) -> dict:
    """{'every': {d: success}, 'one_in_flight': {d: success}} (d = 0, 1 in both: identical)."""
    curve = {'every': {}, 'one_in_flight': {}}
    for p in record['delay']['points']:
        curve[p['point']['delay_frames']][p['point']['action_delay']] = p['success_rate']
    for d, rate in curve['every'].items():
        if d <= 1:
            curve['one_in_flight'].setdefault(d, rate)
    return curve


def success_at(curve: dict, frames: str, delay: int) -> tuple[float, str]:
    """Success on the curve at `delay` periods: measured, linearly interpolated between the
    nearest measured delays ('~'), or beyond the largest ('>')."""
    points = curve.get(frames) or {}
    if delay in points:
        return points[delay], ''
    below = [d for d in points if d < delay]
    above = [d for d in points if d > delay]
    if not points or not below:
        return math.nan, '?'
    if not above:
        d = max(below)
        return points[d], '>'
    lo, hi = max(below), min(above)
    w = (delay - lo) / (hi - lo)
    return (1 - w) * points[lo] + w * points[hi], '~'


def placements(record: dict) -> list[dict]:
    """Each mode's latency placed on the delay curve at each rate: model only (paced camera)
    and, where the lock-step part ran, on the node."""
    if 'delay' not in record or 'speed' not in record:
        return []
    curve = delay_curve(record)
    node = {r['mode']: r for r in (record.get('lockstep') or {}).get('rows', [])
            if r['relax_threshold'] == 0}
    out = []
    for rate_key, per_mode in record['speed'].get('paced', {}).items():
        rate = float(rate_key)
        for mode, paced in per_mode.items():
            keeps_up = paced['answered_fraction'] >= KEEPS_UP_FRACTION
            frames = 'every' if keeps_up else 'one_in_flight'
            entry = {'mode': mode, 'rate_hz': rate, 'frames': frames,
                     'answered_fraction': paced['answered_fraction']}
            for source, latency in (('model', paced['latency_p50_ms']),
                                    ('node', node.get(mode, {}).get('latency_p50_ms'))):
                latency = _num(latency)
                if math.isnan(latency):
                    continue
                delay = max(1, math.ceil(latency * 1e-3 * rate - 1e-9))
                success, mark = success_at(curve, frames, delay)
                entry[source] = {'latency_p50_ms': latency, 'delay': delay,
                                 'success': success, 'mark': mark}
            out.append(entry)
    return out


def format_delay_table(record: dict) -> str:
    delay = record['delay']
    curve = delay_curve(record)
    rates = list(record.get('speed', {}).get('paced', {})) or []
    head = ['delay d (periods)', 'success, every frame answered', 'success, one frame in flight']
    head += [f'= ms at {float(r):g} Hz' for r in rates]
    rows = []
    for d in sorted(set(curve['every']) | set(curve['one_in_flight'])):
        rows.append([d, _fmt(curve['every'].get(d)), _fmt(curve['one_in_flight'].get(d))]
                    + [f'{1e3 * d / float(r):.0f}' for r in rates])
    text = _table(head, rows)
    text += (f"\n{_episodes(delay['episodes'])} per task and point, hold "
             f"{delay['hold']}, {delay['path']}\n")
    places = placements(record)
    if places:
        head = ['mode', 'rate Hz', 'frames answered', 'model-only latency p50 ms', 'd',
                'success at d', 'node latency p50 ms (lock-step)', 'd', 'success at d']
        rows = []
        for p in places:
            cells = [p['mode'], f"{p['rate_hz']:g}",
                     f"{100 * p['answered_fraction']:.0f}% ({p['frames'].replace('_', ' ')})"]
            for source in ('model', 'node'):
                s = p.get(source)
                cells += (['-'] * 3 if s is None else
                          [_fmt(s['latency_p50_ms'], 1), s['delay'],
                           s['mark'] + _fmt(s['success'])])
            rows.append(cells)
        text += ('\nEach mode on the curve: d = ceil(latency × rate); one frame in flight '
                 'when the mode answered fewer than '
                 f'{100 * KEEPS_UP_FRACTION:.0f}% of the camera frames (~ interpolated, '
                 '> beyond the largest delay measured):\n\n' + _table(head, rows))
    return text


def format_relax_table(record: dict) -> str:
    relax = record['relax']
    head = ['r', 'success', 'acceptance length', 'forwards/action', 'tokens ≠ AR',
            'largest bin distance to AR', 'episodes']
    rows = []
    for p in relax['points']:
        counts = p['bin_distance_counts']
        total = sum(sum(c) for c in counts) or 1
        largest = max((k for c in counts for k, n in enumerate(c) if n), default=0)
        rows.append([p['point']['relax_threshold'], _fmt(p['success_rate']),
                     _fmt(p['acceptance_length']), _fmt(p['forwards_per_action']),
                     f"{100 * p['num_token_mismatches'] / total:.1f}%", largest,
                     len(p['episodes'])])
    tree = relax['tree']
    return (_table(head, rows) + f"\nmode {relax['mode']}, draft tree depth {tree[0]}, top-k "
            f"{tree[1]}, {tree[2]} nodes; {_episodes(relax['episodes'])} per task and r; "
            f"{relax['path']}\n")


def format_report(record: dict) -> str:
    """Every table of a run, in the order a reader wants them."""
    tasks = record['tasks']
    out = []
    if 'lockstep' in record:
        lock = record['lockstep']
        out += [f"## Lock-step through the ROS 2 node and the simulator bridge "
                f"({_episodes(lock['episodes'])} per task and mode)\n",
                format_lockstep_table(record),
                'steps/s: the whole loop, rendering and DDS included (simulator-bound); node '
                'actions/s: 1 / mean frame -> command latency (one frame in flight); '
                'model-only actions/s: the speed table below.\n',
                format_task_table(lock['rows'], tasks,
                                  lambda r: f"{r['mode']} r={r['relax_threshold']}")]
    if 'speed' in record:
        out += ['## Model only (no ROS, no simulator)\n', format_speed_table(record),
                f"`vla-spec bench` workload ({record['speed']['bench_frames']} frames, a camera "
                'faster than inference) for actions/s and × HF (the Hugging Face AR baseline, '
                'same run); the @ Hz columns feed Meta-World frames at that camera rate the way '
                'the node does (the newest frame replaces a waiting one).\n']
    if 'delay' in record:
        out += ['## Success against action delay (delayed lock-step, AR actions)\n',
                format_delay_table(record)]
    if 'relax' in record:
        out += ['## Relaxed acceptance: the trade-off\n', format_relax_table(record)]
    return '\n'.join(out)


# ---- plots -----------------------------------------------------------------------------------

def _pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: skipping the plots (pip install matplotlib)')
        return None
    return plt


def plot_delay(path: Path, record: dict, plt) -> None:
    """Left: success against delay, each mode placed at the first rate. Right: the success
    each mode's model-only latency implies at every rate measured."""
    curve = delay_curve(record)
    rates = list(record.get('speed', {}).get('paced', {}))
    places = placements(record)
    fig, (ax, ax_rate) = plt.subplots(1, 2, figsize=(13, 4.8),
                                      gridspec_kw={'width_ratios': [3, 2]})
    styles = {'every': ('o-', 'every frame answered (pipelined)'),
              'one_in_flight': ('s--', 'one frame in flight')}
    for frames, (style, label) in styles.items():
        points = sorted(curve[frames].items())
        if points:
            ax.plot([d for d, _ in points], [s for _, s in points], style, color='gray'
                    if frames == 'one_in_flight' else 'black', label=label)
    modes = list(dict.fromkeys(p['mode'] for p in places))
    color = {mode: f'C{i}' for i, mode in enumerate(modes)}
    if rates:
        rate = sorted(float(r) for r in rates)[len(rates) // 2]      # the middle rate
        for i, p in enumerate(q for q in places if q['rate_hz'] == rate):
            for source, marker in (('model', 'v'), ('node', '^')):
                s = p.get(source)
                if s is None or math.isnan(_num(s['success'])):
                    continue
                ax.plot(s['delay'] + (i - len(modes) / 2) * 0.05, s['success'], marker,
                        markersize=9, color=color[p['mode']], label=f"{p['mode']} ({source}, "
                        f"{s['latency_p50_ms']:.0f} ms)")
        ax.set_title(f'Modes placed at {rate:g} Hz (1 period = {1e3 / rate:.0f} ms): '
                     'v model only, ^ on the node', fontsize=10)
    ax.set(xlabel='action delay d (control periods)', ylabel='success rate',
           ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='lower left')
    for i, mode in enumerate(modes):      # equal values would hide a line: small offsets
        rows = sorted((p for p in places if p['mode'] == mode and 'model' in p),
                      key=lambda p: p['rate_hz'])
        if rows:
            offset = (i - len(modes) / 2) * 0.006
            successes = [_num(p['model']['success']) + offset for p in rows]
            ax_rate.plot([p['rate_hz'] for p in rows], successes, 'osD^v<>'[i % 7] + '-',
                         color=color[mode], label=mode, alpha=0.85)
    ax_rate.set(xlabel='control rate (Hz)', ylabel='success rate on the delay curve',
                ylim=(-0.05, 1.05))
    ax_rate.set_title('What each mode\'s model-only latency implies', fontsize=10)
    ax_rate.grid(alpha=0.3)
    ax_rate.legend(fontsize=8, loc='lower left')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_relax(path: Path, record: dict, plt) -> None:
    points = sorted(record['relax']['points'], key=lambda p: p['point']['relax_threshold'])
    rs = [p['point']['relax_threshold'] for p in points]
    xs = list(range(len(rs)))              # r values are spread unevenly: categorical axis
    fig, (ax_acc, ax_succ, ax_hist) = plt.subplots(1, 3, figsize=(15, 4.2))
    ax_acc.plot(xs, [_num(p['acceptance_length']) for p in points], 'o-', color='C0',
                label='acceptance length')
    ax_acc.set_ylabel('acceptance length (tokens / verifier forward)', color='C0')
    ax_fwd = ax_acc.twinx()
    ax_fwd.plot(xs, [_num(p['forwards_per_action']) for p in points], 's--', color='C1',
                label='forwards per action')
    ax_fwd.set_ylabel('verifier forwards per action', color='C1')
    ax_succ.plot(xs, [p['success_rate'] for p in points], 'o-', color='C2')
    ax_succ.set(ylabel='success rate', ylim=(-0.05, 1.05))
    for ax in (ax_acc, ax_succ):
        ax.set_xticks(xs, [str(r) for r in rs])
        ax.set_xlabel('relaxation threshold r (bins)')
        ax.grid(alpha=0.3)
    tree = record['relax']['tree']
    ax_acc.set_title(f"spec, draft tree depth {tree[0]}, top-k {tree[1]}", fontsize=10)
    ax_succ.set_title('success rate', fontsize=10)
    # |bin(relaxed) - bin(AR)| per action dimension, at the largest r.
    widest = points[-1]
    counts = widest['bin_distance_counts']
    if counts:
        edges = [0, 1, 2, 3, 5, 9, 17, 33, 10 ** 6]
        names = ['0', '1', '2', '3-4', '5-8', '9-16', '17-32', '>32']
        width = 0.8 / len(counts)
        for dim, c in enumerate(counts):
            total = sum(c) or 1
            shares = [sum(c[lo:hi]) / total for lo, hi in zip(edges[:-1], edges[1:])]
            ax_hist.bar([i + (dim - len(counts) / 2 + 0.5) * width for i in range(len(names))],
                        shares, width, label=f'dim {dim}')
        ax_hist.set_xticks(range(len(names)), names)
        ax_hist.set_yscale('log')
        ax_hist.set(xlabel='|bin(relaxed) - bin(AR)| for the same observation',
                    ylabel='share of tokens')
        ax_hist.set_title(f"r = {widest['point']['relax_threshold']}", fontsize=10)
        ax_hist.legend(fontsize=7, ncol=2)
        ax_hist.grid(alpha=0.3, axis='y')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---- results ---------------------------------------------------------------------------------

def _nan_to_none(value):
    """NaN (nothing measured) -> None, recursively: strict JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def write_results(out_dir, record: dict, stem: str | None = None) -> dict:
    """`<out>/<stem>.json` (strict: null where nothing was measured), `.md` and the plots;
    returns {kind: path or None}. JSON values that were not measured are null."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / (stem or f'demo-{time.strftime("%Y%m%d-%H%M%S")}')
    paths = {'json': stem.with_suffix('.json'), 'md': stem.with_suffix('.md'),
             'delay_png': None, 'relax_png': None}
    record = _nan_to_none(record)
    paths['json'].write_text(json.dumps(record, indent=2, default=str, allow_nan=False))
    plt = _pyplot() if ('delay' in record or 'relax' in record) else None
    if plt is not None and 'delay' in record:
        paths['delay_png'] = stem.parent / f'{stem.name}-delay.png'
        plot_delay(paths['delay_png'], record, plt)
    if plt is not None and 'relax' in record:
        paths['relax_png'] = stem.parent / f'{stem.name}-relax.png'
        plot_relax(paths['relax_png'], record, plt)
    machine = record['machine']
    md = [f'# vla-spec demo ({record["created"]})', '', f'command: `{record["command"]}`', '']
    if record.get('latencies_from'):
        source = record['latencies_from']
        md += [f'Latencies (speed and lock-step parts) from {source["file"]} '
               f'(`{source["command"]}`, {source["created"]}).', '']
    md += [f'model {record["model"]}, max {record["max_steps"]} steps, seed {record["seed"]}, '
           f'parts {", ".join(record["parts"])}, wall time {record.get("wall_s", 0):.0f} s', '',
           'machine: ' + ', '.join(f'{k} {v}' for k, v in machine.items()), '',
           format_report(record)]
    for kind, title in (('delay_png', 'success against action delay'),
                        ('relax_png', 'relaxation trade-off')):
        if paths[kind] is not None:
            md.append(f'![{title}]({paths[kind].name})\n')
    paths['md'].write_text('\n'.join(md))
    return paths


def load_record(path) -> dict:
    return json.loads(Path(path).read_text())


def _num(value) -> float:
    return math.nan if value is None else float(value)


# ---- running ---------------------------------------------------------------------------------

def _expert_rates(task_names, episodes: int, seed: int, max_steps: int) -> dict:
    from vla_spec_ros.sim.demos import evaluate_scripted
    per_task = {t: evaluate_scripted(t, episodes, seed, image_size=64, max_steps=max_steps)
                for t in task_names}
    return {'success_rate': sum(per_task.values()) / len(per_task), 'per_task': per_task,
            'num_episodes': episodes * len(per_task)}


def _run_lockstep(args, plan, unnorm_key) -> dict:
    from tqdm import tqdm

    from vla_spec_ros.harness.closed_loop import run_closed_loop
    from vla_spec_ros.policy import VLAPolicy
    lock = {'episodes': plan['episodes'], 'sim_mode': args.sim_mode,
            'control_rate_hz': plan['control_rate_hz'], 'expert': None, 'rows': []}
    if args.expert:
        lock['expert'] = _expert_rates(plan['tasks'], plan['episodes'], args.seed,
                                       plan['max_steps'])
    total = plan['episodes'] * len(plan['tasks'])
    for mode, r in plan['configs']:
        policy = VLAPolicy.from_pretrained(
            args.model, mode=mode, relax_threshold=r, dtype=args.dtype, device=args.device,
            draft_path=args.draft_path if mode in SPECULATIVE_MODES else None,
            restrict_to_action_tokens=args.restrict_to_action_tokens)
        bar = tqdm(total=total, desc=f'lock-step {mode} r={r}', unit='episode',
                   dynamic_ncols=True)
        wins = []

        def on_episode(result, log, bar=bar, wins=wins):
            wins.append(result.is_success)
            bar.update(1)
            bar.set_postfix(success=f'{sum(wins)}/{len(wins)}')
        try:
            report = run_closed_loop(policy, plan['tasks'], plan['episodes'], seed=args.seed,
                                     sim_mode=args.sim_mode,
                                     control_rate_hz=plan['control_rate_hz'],
                                     max_steps=plan['max_steps'], unnorm_key=unnorm_key,
                                     on_episode=on_episode,
                                     log_level=None if args.verbose else 'error')
        finally:
            bar.close()
        lock['rows'].append(report.to_dict())
        if report.num_timeouts or report.num_republished_frames or report.num_unanswered:
            print(f'[{mode} r={r}] {report.num_timeouts} episodes timed out, '
                  f'{report.num_unanswered} ended by an unanswered frame, '
                  f'{report.num_republished_frames} frames republished: the VLA node held '
                  'some frames (invalid actions? run with --verbose)')
    return lock


def _run_speed(args, plan, unnorm_key) -> dict:
    from tqdm import tqdm

    from vla_spec_ros.harness import speed
    from vla_spec_ros.policy import VLAPolicy
    steps = tqdm(total=1 + len(plan['rates']), desc='model-only speed', unit='part',
                 dynamic_ncols=True)
    try:
        rows = speed.model_speed_rows(args.model, plan['modes'], plan['speed_frames'],
                                      args.device, args.dtype, args.draft_path)
        steps.update(1)
        policy = VLAPolicy.from_pretrained(args.model, dtype=args.dtype, device=args.device,
                                           restrict_to_action_tokens=(
                                               args.restrict_to_action_tokens))
        size = policy.model_config.image_size
        frames = speed.sim_frames(plan['tasks'], max(1, plan['speed_frames']
                                                     // len(plan['tasks']) + 1), size,
                                  unnorm_key=unnorm_key)
        paced = {}
        for rate in plan['rates']:
            paced[str(rate)] = speed.paced_rows(policy, ['hf'] + plan['modes'], frames, rate,
                                                plan['speed_frames'], args.draft_path)
            steps.update(1)
    finally:
        steps.close()
    return {'bench_rows': [asdict(r) for r in rows], 'bench_frames': plan['speed_frames'],
            'paced': paced}


def _sweep_common(args, plan, unnorm_key) -> dict:
    return dict(model=args.model, unnorm_key=unnorm_key, seed=args.seed,
                max_steps=plan['max_steps'], draft_path=args.draft_path,
                workers=plan['workers'], threads=plan['threads'],
                engine_options={'dtype': args.dtype, 'device': args.device,
                                'restrict_to_action_tokens': args.restrict_to_action_tokens})


def _run_delay(args, plan, unnorm_key) -> dict:
    from vla_spec_ros.harness import inprocess
    points = inprocess.delay_points(plan['delays'], args.delay_hold,
                                    plan['one_in_flight_delays'])
    reports = inprocess.run_sweep(points, plan['tasks'], plan['delay_episodes'],
                                  desc='delay: ', **_sweep_common(args, plan, unnorm_key))
    return {'episodes': plan['delay_episodes'], 'hold': args.delay_hold, 'mode': 'ar',
            'path': IN_PROCESS_PATH, 'points': [r.to_dict() for r in reports]}


def _run_relax(args, plan, unnorm_key) -> dict:
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


def print_report(record: dict, paths: dict | None = None) -> None:
    print()
    print(format_report(record))
    if paths:
        print('results: ' + ', '.join(str(p) for p in paths.values() if p is not None))


def run(args) -> int:
    if args.report:            # the tables and plots again, beside the recorded JSON
        report = Path(args.report)
        record, stem = load_record(report), report.stem
        if args.latencies_from:
            other = load_record(args.latencies_from)
            if 'speed' not in other:
                raise ValueError(f'--latencies-from: {args.latencies_from} has no speed part')
            for part in ('speed', 'lockstep'):
                record.pop(part, None)
                if part in other:
                    record[part] = other[part]
            record['latencies_from'] = {'file': Path(args.latencies_from).name,
                                        'command': other['command'],
                                        'created': other['created']}
            stem += '-placed'
        paths = write_results(report.parent, record, stem)
        print_report(record, paths)
        return 0
    if args.latencies_from:
        raise ValueError('--latencies-from: only with --report')
    torch = importlib.import_module('torch')
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason

    plan = resolve_options(args)       # every option checked before anything loads
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
              'machine': machine_info()}
    key = _unnorm_key(args)
    # Model-only first (quietest machine), then the ROS loop, then the sweeps.
    runners = {'speed': _run_speed, 'lockstep': _run_lockstep, 'delay': _run_delay,
               'relax': _run_relax}
    stem = f'demo-{time.strftime("%Y%m%d-%H%M%S")}'
    for part in ('speed', 'lockstep', 'delay', 'relax'):
        if part in plan['parts']:
            record[part] = runners[part](args, plan, key)
            record['wall_s'] = time.perf_counter() - start
            paths = write_results(args.out, record, stem)   # a long run keeps each part
    print_report(record, paths)
    print(f'wall time {record["wall_s"]:.0f} s')
    return 0


__all__ = ['add_arguments', 'run', 'configurations', 'resolve_options', 'format_report',
           'format_lockstep_table', 'format_speed_table', 'format_delay_table',
           'format_relax_table', 'placements', 'delay_curve', 'success_at', 'same_as_ar',
           'write_results', 'load_record', 'machine_info']
