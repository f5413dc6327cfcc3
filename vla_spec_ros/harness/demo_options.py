"""`vla-spec demo`'s options: the command line (`add_arguments`) and the plan of a run
(`resolve_options`: every option checked and defaulted before anything loads, a ValueError
naming the option otherwise), with the checks a checkpoint must pass for the lock-step part
(`action_chunk`, `check_lockstep_model`, also used by launch/sim.launch.py).

Contracts: nothing here loads a model, the simulator or ROS; `resolve_options` returns a plain
dict (the plan) that demo.py's runners read, and refuses repeated list entries (a repeated
entry would run and report the same rows twice).
"""
from __future__ import annotations

import os

from vla_spec_ros.config import DTYPES, MODES
from vla_spec_ros.sim.bridge_settings import DELAY_HOLDS
from vla_spec_ros.harness.streaming import DEFAULT_STREAM_HZ, DEFAULT_STREAM_SECONDS
from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES, get_task

SPECULATIVE_MODES = ('spec', 'pipeline_spec')
PARTS = ('stream', 'lockstep', 'speed', 'delay', 'relax')
DEFAULT_PARTS = ('stream', 'lockstep', 'speed', 'delay')
MAX_STREAM_SECONDS = 600.0
FULL_EPISODES = 20


def add_arguments(parser) -> None:
    parser.add_argument('--model', default='metaworld-demo',
                        help='checkpoint folder, embedded model or preset name')
    parser.add_argument('--second-model', default='auto',
                        help='after --model, the stream, speed and lockstep parts again for '
                        'this model (through the node in real time, with the chunk blend its '
                        'family recommends), as a record of its own (demo_second.py); auto: '
                        'the next embedded model (metaworld-demo-fast after metaworld-demo, '
                        'then metaworld-demo-reason), nothing after another model; none: skip')
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
    parser.add_argument('--chunk-blend', default='latest', choices=['latest', 'ensemble'],
                        help='lock-step part, chunked models: the VLA node\'s chunk_blend '
                        '(docs/chunks.md)')
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
        'camera_delays': camera_delays, 'chunk_blend': args.chunk_blend,
    }
    return plan


def _config_json(model: str) -> dict:
    import json

    from vla_spec_ros.policy import resolve_checkpoint
    return json.loads((resolve_checkpoint(model) / 'config.json').read_text())


def action_chunk(model: str) -> int:
    """Control steps per answer of a checkpoint, without loading it: what its family reads in
    its config.json (models/registry.py; OpenVLA's `action_chunk`, default 1, pi0-FAST's
    `chunk_size`, LeRobot's name)."""
    from vla_spec_ros.models import registry
    config = _config_json(model)
    return registry.detect(config).action_chunk(config)


def recommended_chunk_blend(model: str) -> str:
    """The node's `chunk_blend` a checkpoint's family recommends (its registry entry's
    node_settings: pi0-FAST's chunks measured best with `ensemble`), else the node's
    default `latest`."""
    from vla_spec_ros.models import registry
    return registry.detect(_config_json(model)).node_settings.get('chunk_blend', 'latest')


def check_lockstep_model(model: str, sim_mode: str) -> None:
    """Lock-step through the node needs a single-step model (demo.py's doc, lockstep part)."""
    chunk = action_chunk(model)
    if chunk > 1 and sim_mode == 'lockstep':
        raise ValueError(
            f'--parts lockstep: {model} is a chunked model (action_chunk {chunk}); lock-step '
            'steps the arm once per answered frame while the node publishes a chunk\'s steps on '
            'its clock, one per control period. Run its success against delay in process '
            '(--parts delay: chunks executed time-aligned) or through the node with '
            '--sim-mode realtime')


__all__ = ['add_arguments', 'configurations', 'resolve_options', 'action_chunk',
           'recommended_chunk_blend', 'check_lockstep_model']
