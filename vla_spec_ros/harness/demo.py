"""`vla-spec demo`: the embedded model closed-loop in Meta-World through the real ROS 2 node.

For every decoding mode (and, for the speculative ones, every relaxation threshold r) the
policy is loaded once and `closed_loop.run_closed_loop` runs the same seeded episodes; the
scripted expert can be measured on the same seeds as a reference row (`--expert`). Prints a
markdown table (success rate overall and per task, actions/s, latency, acceptance length,
verifier forwards per action) and writes `<out>/demo-<timestamp>.json`, `.md` (with the command
line and the machine) and `.png`: success rate and acceptance length against r, one line per
speculative mode, the non-speculative modes as horizontal references (Spec-VLA, Figure 4).

matplotlib is optional: without it the plot is skipped with a message, the run still succeeds.
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
from importlib import metadata
from pathlib import Path

from vla_spec_ros.config import DTYPES, MODES
from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES, get_task

SPECULATIVE_MODES = ('spec', 'pipeline_spec')


def add_arguments(parser) -> None:
    parser.add_argument('--model', default='metaworld-demo',
                        help='checkpoint folder, embedded model or preset name')
    parser.add_argument('--tasks', default=','.join(DEFAULT_TASK_NAMES),
                        help='comma-separated Meta-World task names')
    parser.add_argument('--episodes', type=int, default=5,
                        help='episodes per task (the recorded results use 20)')
    parser.add_argument('--modes', default='ar,pipeline,spec,pipeline_spec')
    parser.add_argument('--relax-thresholds', default='0,2,8',
                        help='relaxation thresholds (bins) for the speculative modes')
    parser.add_argument('--sim-mode', default='lockstep', choices=['lockstep', 'realtime'])
    parser.add_argument('--control-rate-hz', type=float, default=10.0)
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
                        help='also measure the scripted expert on the same seeds')


def _split(text: str, name: str) -> list[str]:
    items = [t.strip() for t in text.split(',') if t.strip()]
    if not items:
        raise ValueError(f'{name}: expected a comma-separated list, got {text!r}')
    return items


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
    return info


def _fmt(value, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return '-'
    return f'{value:.{digits}f}'


def format_table(reports, task_names, expert: dict | None = None) -> str:
    """Markdown table, one row per report (and the expert's first when given)."""
    tasks = list(task_names)
    head = (['mode', 'r', 'success'] + tasks + ['actions/s', 'latency p50 ms', 'p99 ms',
                                                'acceptance length', 'forwards/action',
                                                'episodes'])
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    if expert is not None:
        cells = (['expert', '-', _fmt(expert['success_rate'])]
                 + [_fmt(expert['per_task'].get(t)) for t in tasks]
                 + ['-'] * 5 + [str(expert['num_episodes'])])
        lines.append('| ' + ' | '.join(cells) + ' |')
    for r in reports:
        cells = ([r.mode, str(r.relax_threshold), _fmt(r.success_rate)]
                 + [_fmt(r.success_rate_per_task.get(t)) for t in tasks]
                 + [_fmt(r.actions_per_s), _fmt(r.latency_p50_ms, 1), _fmt(r.latency_p99_ms, 1),
                    _fmt(r.acceptance_length), _fmt(r.forwards_per_action),
                    str(len(r.episodes))])
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def plot_results(path: Path, reports, expert: dict | None = None) -> bool:
    """Success rate and acceptance length vs r; False (with a message) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: skipping the plot (pip install matplotlib)')
        return False
    fig, (ax_success, ax_accept) = plt.subplots(1, 2, figsize=(10, 4))
    for mode in SPECULATIVE_MODES:
        rows = sorted((r for r in reports if r.mode == mode), key=lambda r: r.relax_threshold)
        if rows:
            xs = [r.relax_threshold for r in rows]
            ax_success.plot(xs, [r.success_rate for r in rows], marker='o', label=mode)
            ax_accept.plot(xs, [r.acceptance_length for r in rows], marker='o', label=mode)
    for r in reports:
        if r.mode not in SPECULATIVE_MODES:     # one run each: horizontal references
            ax_success.axhline(r.success_rate, linestyle='--', color='gray' if r.mode == 'ar'
                               else 'silver', label=r.mode)
    if expert is not None:
        ax_success.axhline(expert['success_rate'], linestyle=':', color='black', label='expert')
    ax_accept.axhline(1.0, linestyle='--', color='gray', label='ar')
    ax_success.set(xlabel='relaxation threshold r (bins)', ylabel='success rate',
                   ylim=(-0.05, 1.05))
    ax_accept.set(xlabel='relaxation threshold r (bins)', ylabel='acceptance length')
    for ax in (ax_success, ax_accept):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def _nan_to_none(value):
    """NaN (nothing measured) -> None, recursively: strict JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def write_results(out_dir, record: dict, reports, task_names, expert=None) -> dict:
    """Write demo-<timestamp>.json / .md / .png into `out_dir`; returns {kind: path or None}.

    The JSON is strict (no bare NaN): values that were not measured are null."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f'demo-{time.strftime("%Y%m%d-%H%M%S")}'
    record = dict(record, expert=expert, rows=[r.to_dict() for r in reports])
    paths = {'json': stem.with_suffix('.json'), 'md': stem.with_suffix('.md'),
             'png': stem.with_suffix('.png')}
    paths['json'].write_text(json.dumps(_nan_to_none(record), indent=2, default=str,
                                        allow_nan=False))
    machine = record['machine']
    has_plot = plot_results(paths['png'], reports, expert)
    md = [f'# vla-spec demo ({record["created"]})', '', f'command: `{record["command"]}`', '',
          f'model {record["model"]}, sim mode {record["sim_mode"]}, '
          f'{record["control_rate_hz"]} Hz, max {record["max_steps"]} steps, '
          f'{record["episodes"]} episodes per task, seed {record["seed"]}', '',
          'machine: ' + ', '.join(f'{k} {v}' for k, v in machine.items()), '',
          format_table(reports, task_names, expert)]
    if has_plot:
        md.append(f'![success rate and acceptance length vs r]({paths["png"].name})\n')
    paths['md'].write_text('\n'.join(md))
    if not has_plot:
        paths['png'] = None
    return paths


def _expert_rates(task_names, episodes: int, seed: int, max_steps: int) -> dict:
    from vla_spec_ros.sim.demos import evaluate_scripted
    per_task = {t: evaluate_scripted(t, episodes, seed, image_size=64, max_steps=max_steps)
                for t in task_names}
    return {'success_rate': sum(per_task.values()) / len(per_task), 'per_task': per_task,
            'num_episodes': episodes * len(per_task)}


def run(args) -> int:
    torch = importlib.import_module('torch')
    from vla_spec_ros.harness.closed_loop import (check_control_rate, check_max_steps,
                                                  run_closed_loop)
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason

    # Every option is checked before the simulator starts or any policy loads.
    task_names = _check_unique([get_task(t).name for t in _split(args.tasks, '--tasks')],
                               '--tasks')
    try:
        thresholds = [int(r) for r in _split(args.relax_thresholds, '--relax-thresholds')]
    except ValueError:
        raise ValueError(f'--relax-thresholds: expected integers, got '
                         f'{args.relax_thresholds!r}') from None
    configs = configurations(_split(args.modes, '--modes'), thresholds)
    if args.episodes < 1:
        raise ValueError(f'--episodes: must be >= 1, got {args.episodes}')
    check_control_rate(args.control_rate_hz, '--control-rate-hz')
    check_max_steps(args.max_steps, '--max-steps')
    reason = sim_unavailable_reason()
    if reason is not None:
        raise ValueError(f'the simulator is unavailable: {reason}')
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f'--threads: must be >= 1, got {args.threads}')
        torch.set_num_threads(args.threads)
    argv = getattr(args, 'argv', sys.argv[1:])
    record = {'command': 'vla-spec ' + ' '.join(shlex.quote(a) for a in argv),
              'created': time.strftime('%Y-%m-%d %H:%M:%S'), 'model': args.model,
              'tasks': task_names, 'episodes': args.episodes, 'seed': args.seed,
              'sim_mode': args.sim_mode, 'control_rate_hz': args.control_rate_hz,
              'max_steps': args.max_steps, 'dtype': args.dtype, 'device': args.device,
              'machine': machine_info()}
    expert = None
    if args.expert:
        expert = _expert_rates(task_names, args.episodes, args.seed, args.max_steps)
    reports = []
    for mode, r in configs:
        policy = VLAPolicy.from_pretrained(
            args.model, mode=mode, relax_threshold=r, dtype=args.dtype, device=args.device,
            draft_path=args.draft_path if mode in SPECULATIVE_MODES else None,
            restrict_to_action_tokens=args.restrict_to_action_tokens)
        report = run_closed_loop(policy, task_names, args.episodes, seed=args.seed,
                                 sim_mode=args.sim_mode, control_rate_hz=args.control_rate_hz,
                                 max_steps=args.max_steps, unnorm_key=args.unnorm_key,
                                 progress=True)
        reports.append(report)
        if report.num_timeouts or report.num_republished_frames or report.num_unanswered:
            print(f'[{mode} r={r}] {report.num_timeouts} episodes timed out, '
                  f'{report.num_unanswered} ended by an unanswered frame, '
                  f'{report.num_republished_frames} frames republished: the VLA node held '
                  'some frames (invalid actions? see its log)')
    table = format_table(reports, task_names, expert)
    print(table)
    paths = write_results(args.out, record, reports, task_names, expert)
    print('wrote ' + ', '.join(str(p) for p in paths.values() if p is not None))
    return 0


__all__ = ['add_arguments', 'run', 'configurations', 'format_table', 'plot_results',
           'write_results', 'machine_info']
