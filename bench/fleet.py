"""Several robots on one `vla_spec` node, over real DDS: throughput per robot, and a soak.

The node runs as its own process (`python -m vla_spec_ros.ros.node`, the embedded model by
default); this process plays the robots: one camera per robot publishing Meta-World frames at
`--camera-hz` from a thread of its own (each robot its own task and instruction; each frame
stamped with its publish time, which its twist carries back), and it matches every twist to its
frame: frames answered and frame -> twist latency (publish -> receipt, both here) per robot. It
also reads the node's /diagnostics: latency from image receipt to publish, frames dropped, and
where a frame's time went on the node (queue, convert, wait, steps, publish: p50 and p99).

    python bench/fleet.py --robots 1,2,4 --modes ar,pipeline,pipeline_spec --seconds 30
    python bench/fleet.py --robots 2 --modes pipeline_spec --soak-seconds 1800

Table mode: for each (robots, mode) a fresh node; actions/s per robot and in total over the
measured window (after `--warmup-seconds`). Soak mode: one node; every `--sample-seconds` a row
of the node's resident memory (VmRSS), frame -> twist p50 / p99 / oldest over that window and
frames answered in it, the node's own latency, actions and dropped frames; then the verdicts:
memory growth against the first sample after warm-up, the worst window's p99 against the first
window's, the oldest command against `--max-action-age`. Results: bench/results/fleet-*.md
and .json. Camera, DDS and the node share this machine's cores: on a 2-core CPU the cameras'
rendering-free publishing still costs a part of one core, so absolute rates are pessimistic.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / 'bench' / 'results'


def robot_names(count: int) -> list[str]:
    return [f'arm{i}' for i in range(count)]


def camera_frames(num_robots: int, per_robot: int, seed: int,
                  kind: str = 'resets') -> list[tuple[str, list]]:
    """(instruction, frames) per robot, a Meta-World task per robot (random images when the
    simulator is not installed). ``resets``: frames from resets with different seeds (a new
    placement every frame); ``episode``: consecutive control steps of the scripted expert's
    path (a robot's camera watching its arm move; a finished episode starts the next one), what
    temporal drafting (``draft_path: previous_action``) drafts from. The camera loops over
    them."""
    from vla_spec_ros.sim.demos import choose_instruction
    from vla_spec_ros.sim.metaworld_env import (DEFAULT_TASK_NAMES, get_task, make_env,
                                                sim_unavailable_reason)

    out = []
    for i in range(num_robots):
        task = get_task(DEFAULT_TASK_NAMES[i % len(DEFAULT_TASK_NAMES)])
        instruction = choose_instruction(task, seed + i)
        if sim_unavailable_reason() is not None:
            rng = np.random.default_rng(seed + i)
            frames = [rng.integers(0, 256, (64, 64, 3), np.uint8) for _ in range(per_robot)]
        elif kind == 'resets':
            with make_env(task.name, seed=seed + i) as env:    # one renderer alive at a time
                frames = [env.reset(seed=seed + 100 * i + k) for k in range(per_robot)]
        else:
            with make_env(task.name, seed=seed + i) as env:
                episode = 0
                frames = [env.reset(seed=seed + 100 * i)]
                while len(frames) < per_robot:
                    image, _, is_done, _ = env.step(env.expert_action())
                    frames.append(image)
                    if is_done and len(frames) < per_robot:
                        episode += 1
                        frames.append(env.reset(seed=seed + 100 * i + episode))
        out.append((instruction, frames))
    return out


def node_command(args, mode: str, robots: list[str], instructions: list[str],
                 max_prefills: int = 1) -> list[str]:
    if args.switch_interval:
        # The node's main under a shorter GIL switch interval (an experiment knob: how long a
        # thread waiting for the GIL, the executor's, may wait for the busy worker).
        launcher = ['-c', f'import sys; sys.setswitchinterval({args.switch_interval}); '
                    'from vla_spec_ros.ros.node import main; sys.exit(main())']
    else:
        launcher = ['-m', 'vla_spec_ros.ros.node']
    argv = [sys.executable, *launcher, '--ros-args',
            '-p', f'model_path:={args.model}', '-p', f'mode:={mode}',
            '-p', f'robots:=[{",".join(robots)}]', '-p', 'enabled:=true',
            '-p', f'max_action_age:={args.max_action_age}',
            '-p', f'max_prefills_per_step:={max_prefills}',
            '-p', 'diagnostics_period:=1.0', '-r', '__node:=vla_fleet']
    for param in args.param:
        argv += ['-p', param]
    for robot, instruction in zip(robots, instructions):
        argv += ['-p', f'{robot}.instruction:={instruction}']
    return argv


def rss_mb(pid: int) -> float:
    for line in Path(f'/proc/{pid}/status').read_text().splitlines():
        if line.startswith('VmRSS:'):
            return int(line.split()[1]) / 1024.0
    return float('nan')


class Robots:
    """Camera publishers and twist / diagnostics listeners for every robot."""

    def __init__(self, context, robots, frames, camera_hz: float):
        from diagnostic_msgs.msg import DiagnosticArray
        from geometry_msgs.msg import TwistStamped
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from vla_spec_ros.image_messages import array_to_image

        self.node = Node('fleet_bench', context=context)
        self._lock = threading.Lock()
        self.robots = robots
        self.actions = {r: 0 for r in robots}
        self.zeros = {r: 0 for r in robots}
        self.published = 0          # camera ticks (one frame per robot each)
        self.diagnostics = {}
        # The node process's garbage collections, from its engine status (ros/gc_pauses.py):
        # the longest pause and the most full collections of one window, while timed.
        self.gc = {'pause_max_ms': 0.0, 'full_collections_max_window': 0}
        # (sec, nanosec) stamp -> publish time (monotonic), and per robot each answered
        # frame's latency, from `measure_from` on (the warm-up is not counted).
        self._sent: dict = {}
        self.latencies = {r: [] for r in robots}
        self.measure_from = float('inf')
        self._period = 1.0 / camera_hz
        self._stop = threading.Event()
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self._pubs = {r: self.node.create_publisher(Image, f'/{r}/image', qos) for r in robots}
        self._frames = dict(zip(robots, frames))
        self._tick = 0
        self._to_image = array_to_image
        for robot in robots:
            self.node.create_subscription(TwistStamped, f'/{robot}/twist',
                                          lambda m, r=robot: self._on_twist(r, m), qos)
        self.node.create_subscription(DiagnosticArray, '/diagnostics', self._on_diag, 10)
        # A camera of its own thread, on a fixed schedule: an rclpy timer on a busy 2-core
        # machine fired at a third of the asked rate.
        self._camera = threading.Thread(target=self._camera_loop, daemon=True)
        self._camera.start()

    def stop(self):
        self._stop.set()
        self._camera.join(timeout=5.0)

    def _camera_loop(self):
        next_tick = time.monotonic()
        while not self._stop.is_set():
            self._publish()
            next_tick += self._period
            delay = next_tick - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:                           # behind: skip the missed ticks, as a camera does
                next_tick = time.monotonic()

    def _publish(self):
        stamp = self.node.get_clock().now().to_msg()
        sent = time.monotonic()
        with self._lock:
            if sent >= self.measure_from:
                self._sent[(stamp.sec, stamp.nanosec)] = sent
        for robot, pub in self._pubs.items():
            frames = self._frames[robot]
            pub.publish(self._to_image(frames[self._tick % len(frames)], 'rgb8', stamp=stamp))
        self._tick += 1
        with self._lock:
            self.published = self._tick

    def _on_twist(self, robot, msg):
        received = time.monotonic()
        t = msg.twist
        is_zero = not any((t.linear.x, t.linear.y, t.linear.z,
                           t.angular.x, t.angular.y, t.angular.z))
        with self._lock:
            if is_zero:
                self.zeros[robot] += 1
            else:
                self.actions[robot] += 1
                sent = self._sent.get((msg.header.stamp.sec, msg.header.stamp.nanosec))
                if sent is not None:
                    self.latencies[robot].append(received - sent)

    def latencies_since(self, seen: dict) -> tuple[dict, dict]:
        """Per robot the frame -> twist latencies (s) recorded after index ``seen[robot]``,
        and the new indices: one window of a soak."""
        with self._lock:
            window = {r: list(self.latencies[r][seen[r]:]) for r in self.robots}
            return window, {r: len(self.latencies[r]) for r in self.robots}

    def timed_frames(self) -> int:
        """Camera ticks since ``measure_from`` (each a frame per robot)."""
        with self._lock:
            return len(self._sent)

    def _on_diag(self, msg):
        with self._lock:
            for status in msg.status:
                if status.name.endswith(': engine') and self.measure_from < float('inf'):
                    # (a window reaches back up to window_s before timing started)
                    values = {kv.key: kv.value for kv in status.values}
                    pause = _float(values, 'gc_pause_max_ms')
                    full = _float(values, 'gc_full_collections_in_window')
                    if not np.isnan(pause):            # a node without the keys: nothing
                        self.gc['pause_max_ms'] = max(self.gc['pause_max_ms'], pause)
                    if not np.isnan(full):
                        self.gc['full_collections_max_window'] = max(
                            self.gc['full_collections_max_window'], int(full))
                for robot in self.robots:
                    if status.name.endswith(f'({robot})'):
                        self.diagnostics[robot] = {kv.key: kv.value for kv in status.values}

    def counts(self):
        with self._lock:
            return dict(self.actions), dict(self.zeros), {
                r: dict(d) for r, d in self.diagnostics.items()}

    def frames_published(self) -> int:
        with self._lock:
            return self.published


def _float(diag: dict, key: str) -> float:
    try:
        return float(diag.get(key, 'nan'))
    except ValueError:
        return float('nan')


def run_one(args, context, num_robots: int, mode: str, frames_by_robot,
            on_sample=None, max_prefills: int = 1) -> dict:
    robots = robot_names(num_robots)
    instructions = [instruction for instruction, _ in frames_by_robot[:num_robots]]
    frames = [f for _, f in frames_by_robot[:num_robots]]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED='1')
    process = subprocess.Popen(node_command(args, mode, robots, instructions, max_prefills),
                               env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log_lines = []
    threading.Thread(target=lambda: log_lines.extend(process.stdout), daemon=True).start()
    bench = Robots(context, robots, frames, args.camera_hz)
    # One executor per configuration, stopped before its node is destroyed: destroying a node
    # while a shared executor is building its wait set raises in the spin thread, which then
    # dies silently and every later configuration reads zero actions. Single-threaded: the
    # robots' side only counts and stamps twists, and a two-thread MultiThreadedExecutor here
    # delivered twists up to 0.45 s after the node published them (node-side age <= 85 ms,
    # received age up to 525 ms, 2 robots at 30 Hz), which read as stale commands and
    # unanswered frames that the node never caused.
    from vla_spec_ros.harness.node_threads import NodeThreads
    spinning = NodeThreads(context, [[bench.node]], name='fleet_robots')
    try:
        deadline = time.monotonic() + 120.0
        while not any('ready' in line for line in log_lines):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError('node did not start:\n' + ''.join(log_lines[-30:]))
            time.sleep(0.2)
        time.sleep(args.warmup_seconds)
        _, _, start_diag = bench.counts()
        start_frames = bench.frames_published()
        start = time.monotonic()
        bench.measure_from = start
        duration = args.soak_seconds or args.seconds
        samples = []
        seen = {r: 0 for r in robots}           # latencies already in an earlier window
        timed_before = 0
        while time.monotonic() - start < duration:
            time.sleep(min(args.sample_seconds, duration - (time.monotonic() - start)))
            if on_sample is not None:
                actions, zeros, diag = bench.counts()
                window, seen = bench.latencies_since(seen)
                timed_now = bench.timed_frames()
                samples.append(on_sample(time.monotonic() - start, rss_mb(process.pid),
                                         actions, zeros, diag, window,
                                         timed_now - timed_before))
                timed_before = timed_now
        elapsed = time.monotonic() - start
        bench.measure_from = float('inf')       # frames from now on are not timed
        camera_hz = (bench.frames_published() - start_frames) / elapsed   # before the drain
        time.sleep(min(1.0, args.max_action_age))   # the last timed frames' answers
        actions, zeros, diag = bench.counts()
    finally:
        bench.stop()
        spinning.shutdown()
        bench.node.destroy_node()
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
    timed = bench.timed_frames()
    latencies = {r: np.asarray(bench.latencies[r]) * 1e3 for r in robots}
    # Actions answering the frames of the measured window, over the window (the drain after
    # it only lets the last of them arrive).
    per_robot = {r: len(latencies[r]) / elapsed for r in robots}
    stages = {r: {key: _float(diag.get(r, {}), key) for key in STAGE_KEYS} for r in robots}
    dropped = {r: _float(diag.get(r, {}), 'frames_dropped')
               - _float(start_diag.get(r, {}), 'frames_dropped') for r in robots}
    return {'robots': num_robots, 'mode': mode, 'max_prefills_per_step': max_prefills,
            'seconds': elapsed,
            'actions_per_s': per_robot, 'total_actions_per_s': sum(per_robot.values()),
            'latency_p50_ms': {r: _float(diag.get(r, {}), 'latency_p50_ms') for r in robots},
            'latency_p99_ms': {r: _float(diag.get(r, {}), 'latency_p99_ms') for r in robots},
            'frames_dropped': dropped, 'zero_twists': zeros, 'camera_hz': camera_hz,
            'frames_timed': timed,
            'answered': {r: len(latencies[r]) / timed if timed else float('nan')
                         for r in robots},
            'frame_to_twist_ms': {r: _quantiles(latencies[r]) for r in robots},
            'node_stages_ms': stages, 'samples': samples, 'gc': dict(bench.gc)}


NODE_STAGES = ('queue', 'convert', 'wait', 'steps', 'publish')     # diagnostics.FRAME_STAGES
STAGE_KEYS = tuple(f'{stage}_p{q}_ms' for stage in NODE_STAGES for q in (50, 99))


def _quantiles(values_ms) -> dict:
    if not len(values_ms):
        return dict.fromkeys(('p50', 'p99', 'mean', 'max'), float('nan'))
    return {'p50': float(np.percentile(values_ms, 50)),
            'p99': float(np.percentile(values_ms, 99)),
            'mean': float(np.mean(values_ms)), 'max': float(np.max(values_ms))}


def table(rows) -> str:
    lines = ['| robots | mode | actions/s per robot (min–max) | total actions/s | frames '
             'answered (worst robot) | frame → twist p50 / p99 / mean ms (worst robot) | '
             'node: receipt → publish p50 / p99 ms | frames dropped/s | camera Hz achieved |',
             '|---|---|---|---|---|---|---|---|---|']
    for row in rows:
        rates = list(row['actions_per_s'].values())
        p50 = max(row['latency_p50_ms'].values())
        p99 = max(row['latency_p99_ms'].values())
        dropped = sum(row['frames_dropped'].values()) / row['seconds']
        prefills = row.get('max_prefills_per_step', 1)
        mode = row['mode'] if prefills == 1 else f'{row["mode"]} x{prefills} prefills'
        answered = min(row.get('answered', {}).values(), default=float('nan'))
        e2e = row.get('frame_to_twist_ms', {}).values()
        worst = max(e2e, key=lambda q: q['p99'], default=None)
        e2e_text = 'n/a' if worst is None else \
            f'{worst["p50"]:.0f} / {worst["p99"]:.0f} / {worst["mean"]:.0f}'
        lines.append(f'| {row["robots"]} | {mode} | {min(rates):.1f}–{max(rates):.1f} '
                     f'| {row["total_actions_per_s"]:.1f} | {answered:.1%} | {e2e_text} '
                     f'| {p50:.0f} / {p99:.0f} '
                     f'| {dropped:.1f} | {row.get("camera_hz", float("nan")):.1f} |')
    return '\n'.join(lines)


def stage_table(rows) -> str:
    """Where a frame's time went on the node (its /diagnostics, worst robot per stage)."""
    stages = NODE_STAGES
    lines = ['| robots | mode | ' + ' | '.join(f'{s} p50 / p99 ms' for s in stages) + ' |',
             '|---|---|' + '---|' * len(stages)]
    for row in rows:
        per_robot = row.get('node_stages_ms', {}).values()
        cells = []
        for stage in stages:
            p50 = max((d[f'{stage}_p50_ms'] for d in per_robot), default=float('nan'))
            p99 = max((d[f'{stage}_p99_ms'] for d in per_robot), default=float('nan'))
            cells.append(f'{p50:.1f} / {p99:.1f}')
        lines.append(f'| {row["robots"]} | {row["mode"]} | ' + ' | '.join(cells) + ' |')
    pauses = [(row['robots'], row['mode'], row['gc']) for row in rows if 'gc' in row]
    if pauses:
        lines += ['', 'Garbage collections in the node process while timed (its engine '
                  'status; its 10 s windows may reach back before timing): ' + '; '.join(
                      f'{n} robot(s) {mode}: longest pause {gc["pause_max_ms"]:.1f} ms, up to '
                      f'{gc["full_collections_max_window"]} full collection(s) in one window'
                      for n, mode, gc in pauses)]
    return '\n'.join(lines)


def soak_verdict(samples, max_action_age_s: float, warmup_s: float = 120.0) -> list[str]:
    """The soak's three checks as lines of text: memory growth after warm-up, every window's
    p99 against the first window's, and the oldest command against `max_action_age`."""
    after_warmup = [s for s in samples if s['t_s'] >= warmup_s] or samples
    growth = 100.0 * (samples[-1]['rss_mb'] / after_warmup[0]['rss_mb'] - 1.0)
    first_p99 = samples[0]['window_p99_ms']
    worst = max(samples, key=lambda s: s['window_p99_ms'])
    oldest = max(s['window_oldest_ms'] for s in samples)
    return [
        f'- Memory growth from t = {after_warmup[0]["t_s"]:.0f} s to the end: {growth:+.2f} % '
        f'({"met" if growth < 1.0 else "MISSED"}: < 1 %)',
        f'- Worst window p99 {worst["window_p99_ms"]:.0f} ms (t = {worst["t_s"]:.0f} s) = '
        f'{worst["window_p99_ms"] / first_p99:.2f}x the first window\'s {first_p99:.0f} ms '
        f'({"met" if worst["window_p99_ms"] <= 2.0 * first_p99 else "MISSED"}: <= 2x)',
        f'- Oldest command received: {oldest:.0f} ms, max_action_age {max_action_age_s * 1e3:.0f}'
        f' ms ({"met" if oldest <= max_action_age_s * 1e3 else "MISSED"})']


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo')
    parser.add_argument('--robots', default='1,2,4')
    parser.add_argument('--modes', default='ar,pipeline,pipeline_spec')
    parser.add_argument('--seconds', type=float, default=30.0)
    parser.add_argument('--warmup-seconds', type=float, default=5.0)
    parser.add_argument('--camera-hz', type=float, default=30.0)
    parser.add_argument('--camera-frames', default='resets', choices=('resets', 'episode'),
                        help='resets: a new placement every frame (8 frames, looped); episode: '
                        'consecutive control steps of the expert (90 frames, looped), as a '
                        'robot\'s camera sees its arm move')
    parser.add_argument('--max-action-age', type=float, default=1.0)
    parser.add_argument('--soak-seconds', type=float, default=0.0,
                        help='one long run (first --robots and --modes value) sampled over time')
    parser.add_argument('--sample-seconds', type=float, default=30.0)
    parser.add_argument('--max-prefills-per-step', default='1',
                        help='comma-separated max_prefills_per_step settings of the pipelined '
                        'modes (each a run of its own)')
    parser.add_argument('--param', action='append', default=[],
                        help='a further node parameter, name:=value (repeatable), e.g. '
                        'tree_min_prob:=0.3')
    parser.add_argument('--switch-interval', type=float, default=0.0,
                        help='run the node under this sys.setswitchinterval (seconds; 0 = '
                        'Python\'s default, 5 ms)')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--out', default=str(RESULTS))
    args = parser.parse_args(argv)

    import rclpy

    counts = [int(x) for x in args.robots.split(',')]
    modes = [m.strip() for m in args.modes.split(',')]
    frames_by_robot = camera_frames(max(counts), 8 if args.camera_frames == 'resets' else 90,
                                    args.seed, args.camera_frames)
    domain = 200 + os.getpid() % 30
    os.environ['ROS_DOMAIN_ID'] = str(domain)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain)
    rows = []
    try:
        if args.soak_seconds:
            def sample(t, rss, actions, zeros, diag, window, frames_in_window):
                # Frame -> twist over this window only (what a robot saw in it), worst robot;
                # `oldest_ms` is the oldest command any robot received in the window.
                quantiles = [_quantiles(np.asarray(v) * 1e3) for v in window.values()]
                answered = [len(v) / frames_in_window if frames_in_window else float('nan')
                            for v in window.values()]
                row = {'t_s': round(t, 1), 'rss_mb': round(rss, 1),
                       'actions': sum(actions.values()), 'zero_twists': sum(zeros.values()),
                       'latency_p50_ms': max(_float(d, 'latency_p50_ms') for d in diag.values()),
                       'latency_p99_ms': max(_float(d, 'latency_p99_ms') for d in diag.values()),
                       'frames_dropped': sum(_float(d, 'frames_dropped') for d in diag.values()),
                       'window_p50_ms': max(q['p50'] for q in quantiles),
                       'window_p99_ms': max(q['p99'] for q in quantiles),
                       'window_oldest_ms': max(q['max'] for q in quantiles),
                       'window_answered': min(answered),
                       # The node's own oldest published action (its last diagnostics window,
                       # image stamp -> publish): beside `window_oldest_ms` it splits an old
                       # command into the node's part and the delivery back to the robot.
                       'node_action_age_max_ms': max(_float(d, 'action_age_max_ms')
                                                     for d in diag.values()),
                       'load_average_1m': round(os.getloadavg()[0], 2)}
                print(json.dumps(row), flush=True)
                return row
            rows.append(run_one(args, context, counts[0], modes[0], frames_by_robot,
                                on_sample=sample))
        else:
            prefill_settings = [int(p) for p in args.max_prefills_per_step.split(',')]
            for num_robots in counts:
                for mode in modes:
                    pipelined = mode in ('pipeline', 'pipeline_spec')
                    for prefills in prefill_settings if pipelined else [1]:
                        row = run_one(args, context, num_robots, mode, frames_by_robot,
                                      max_prefills=prefills)
                        brief = {k: row[k] for k in ('robots', 'mode', 'max_prefills_per_step',
                                                     'total_actions_per_s')}
                        print(json.dumps(brief), flush=True)
                        rows.append(row)
    finally:
        rclpy.shutdown(context=context)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    kind = 'soak' if args.soak_seconds else 'fleet'
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = 'python bench/fleet.py ' + ' '.join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    meta = {'command': command, 'machine': platform.platform(), 'cpus': os.cpu_count(),
            'python': platform.python_version(),
            'load_average_at_end': [round(x, 2) for x in os.getloadavg()]}
    (out / f'{kind}-{stamp}.json').write_text(json.dumps({'meta': meta, 'rows': rows},
                                                         indent=1))
    text = [f'# {kind} {stamp}', '', f'`{command}`', '',
            f'{meta["machine"]}, {meta["cpus"]} CPUs, Python {meta["python"]}, load average at '
            f'the end {meta["load_average_at_end"]} (other work on the machine inflates it)', '']
    if args.soak_seconds:
        samples = rows[0]['samples']
        text += ['| t (s) | RSS (MB) | actions | zero twists | frames answered (window) '
                 '| frame → twist p50 / p99 / oldest ms (window) | node p50 / p99 ms '
                 '| dropped | load (1 min) |',
                 '|---|---|---|---|---|---|---|---|---|']
        text += [f'| {s["t_s"]:.0f} | {s["rss_mb"]:.1f} | {s["actions"]} | {s["zero_twists"]} '
                 f'| {s["window_answered"]:.1%} | {s["window_p50_ms"]:.0f} / '
                 f'{s["window_p99_ms"]:.0f} / {s["window_oldest_ms"]:.0f} '
                 f'| {s["latency_p50_ms"]:.0f} / {s["latency_p99_ms"]:.0f} '
                 f'| {s["frames_dropped"]:.0f} | {s["load_average_1m"]} |' for s in samples]
        text += [''] + soak_verdict(samples, args.max_action_age)
        print('\n'.join(soak_verdict(samples, args.max_action_age)))
    else:
        text += [table(rows), '', 'Where a frame\'s time went on the node (its diagnostics):',
                 '', stage_table(rows)]
        print(table(rows))
        print(stage_table(rows))
    (out / f'{kind}-{stamp}.md').write_text('\n'.join(text) + '\n')
    print(f'wrote {out / f"{kind}-{stamp}.md"}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
