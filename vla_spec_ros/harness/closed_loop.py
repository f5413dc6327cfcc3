"""Closed-loop evaluation through ROS 2: a `vla_spec` node and a `sim_bridge` node in one process.

    SimBridgeNode ~/image, ~/instruction --DDS--> VLASpecNode (worker thread: the engine)
    SimBridgeNode ~/twist, ~/gripper   <--DDS--  VLASpecNode

Both nodes live in a private rclpy Context (its domain from ROS_DOMAIN_ID) under a namespace of
their own, so several harnesses (or other ROS graphs on the same domain) do not cross-talk. The
VLA node is spun on a thread of its own, the bridge and the client on another
(node_threads.NodeThreads), as separate processes would be. Episodes use the seeds and phrasings of
`demos.evaluate_policy` (episode_seed, choose_instruction), so success rates compare with the
scripted expert's from `demos.evaluate_scripted`. Between episodes the VLA node's ~/reset
service drops anything in flight and its `instruction` parameter is set directly (synchronous:
the first frame of an episode can never be answered with the previous instruction).

A chunked policy (`action_chunk` K > 1) runs in real time only: the node publishes a chunk's
steps on its own clock, one per control period, anchored at the image's header stamp
(docs/chunks.md), and the bridge applies the newest command on its tick, so both use the same
clock (the bridge stamps frames with its node clock, the time of capture) and the same control
period (matched_command_parameters). Lock-step steps the arm once per answered frame, which is
not a chunk's plan: `run_closed_loop` refuses it (ValueError). `camera_delay` (real time)
publishes each frame d periods after its capture, stamp kept (realtime_clock.DelayedCamera).

rclpy and the node modules are imported when `run_closed_loop` runs; `ClosedLoopReport` imports
without them.
"""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from vla_spec_ros.sim.bridge_settings import (SIM_MODES, check_camera_delay, check_delay,
                                              matched_command_parameters)
from vla_spec_ros.sim.demos import EpisodeResult, choose_instruction, episode_seed, success_rate
from vla_spec_ros.sim.metaworld_env import DEFAULT_CAMERA, get_task

PEER_TIMEOUT_S = 30.0
SERVICE_TIMEOUT_S = 10.0
ACTION_COUNT_TIMEOUT_S = 2.0
# Meta-World refuses steps past an env's max_path_length, 500 for every v3 task
# (metaworld.sawyer_xyz_env.SawyerXYZEnv); metaworld_env.MetaWorldTask checks the real value.
MAX_EPISODE_STEPS = 500
_harness_ids = itertools.count()


@dataclass
class ClosedLoopReport:
    """One (mode, relax_threshold) run; latencies in ms, NaN where nothing was measured."""

    mode: str
    relax_threshold: int
    sim_mode: str
    control_rate_hz: float
    episodes: list = field(default_factory=list)        # EpisodeResult, in run order
    success_rate: float = math.nan
    success_rate_per_task: dict = field(default_factory=dict)
    num_actions: int = 0             # actions the VLA node published (whole run)
    num_episode_actions: int = 0     # of those, published while an episode ran
    num_steps: int = 0               # simulator steps taken
    wall_s: float = 0.0              # time spent inside episodes
    actions_per_s: float = math.nan  # num_episode_actions / wall_s
    latency_p50_ms: float = math.nan   # frame published -> its twist received by the bridge
    latency_p99_ms: float = math.nan
    latency_mean_ms: float = math.nan
    action_delay: int = 0            # delayed lock-step (delayed_lockstep.DelayedLockstep)
    delay_hold: str = 'previous'
    delay_frames: str = 'every'
    acceptance_length: float = math.nan   # speculative modes only (tokens per verify step)
    forwards_per_action: float = math.nan  # verifier forwards per published action
    num_stale_commands: int = 0
    num_republished_frames: int = 0
    num_timeouts: int = 0
    num_unanswered: int = 0          # lock-step episodes ended by an unanswered frame
    camera_delay: int = 0            # real time: frames published d periods after capture
    num_hold_commands: int = 0       # real time: steps with a hold twist from the node
    num_late_ticks: int = 0          # real time: bridge ticks > 1.5 periods after the last
    # Real time: steps applying an answer, and how many periods after the state it was planned
    # for each was applied (episode_records.EpisodeCounters: 0 = time-aligned).
    num_answer_steps: int = 0
    answer_lag_sum: int = 0
    num_answer_steps_on_time: int = 0
    num_answer_steps_early: int = 0
    max_tick_gap_ms: float = math.nan   # real time: the longest time between two ticks
    action_chunk: int = 1            # control steps per answered frame (the checkpoint's K)
    chunk_blend: str = 'latest'      # the VLA node's chunk_blend (chunked models)
    # A chunked model's steps on the node (ros/diagnostics.py), counted while episodes ran
    # (from the start of each episode to its end; a run-out after the end is not counted).
    num_chunk_steps_published: int = 0
    num_chunk_steps_skipped: int = 0
    num_chunks_replaced: int = 0
    num_chunk_run_outs: int = 0
    num_chunks_refused: int = 0      # did not decode while a kept chunk went on

    @property
    def mean_answer_lag(self) -> float:
        """Real time: mean periods between the state an applied answer was planned for and the
        state it was applied to (NaN without answers)."""
        return (self.answer_lag_sum / self.num_answer_steps if self.num_answer_steps
                else math.nan)

    @property
    def node_actions_per_s(self) -> float:
        """Actions per second of node time (1 / mean frame->command latency): the VLA node
        with DDS, without the simulator. Lock-step has one frame in flight."""
        return 1e3 / self.latency_mean_ms if self.latency_mean_ms > 0 else math.nan

    def to_dict(self) -> dict:
        out = asdict(self)
        out['episodes'] = [asdict(e) for e in self.episodes]
        out['node_actions_per_s'] = self.node_actions_per_s
        out['mean_answer_lag'] = self.mean_answer_lag
        return out

    @classmethod
    def from_dict(cls, data: dict) -> 'ClosedLoopReport':
        data = {k: v for k, v in data.items()
                if k not in ('node_actions_per_s', 'mean_answer_lag')}
        data['episodes'] = [EpisodeResult(**e) for e in data['episodes']]
        return cls(**{k: (math.nan if v is None else v) for k, v in data.items()})


def _percentile_ms(values, q: float) -> float:
    from vla_spec_ros.ros.diagnostics import percentile
    return 1e3 * percentile(values, q) if values else math.nan


def _resolve_unnorm_key(policy, unnorm_key: str | None) -> str:
    keys = tuple(policy.unnorm_keys)
    if unnorm_key is None:
        for preferred in ('metaworld_scripted',):
            if preferred in keys:
                return preferred
        if len(keys) != 1:
            raise ValueError(f'unnorm_key: the checkpoint has {list(keys)}; choose one')
        return keys[0]
    if unnorm_key not in keys:
        raise ValueError(f'unnorm_key: {unnorm_key!r} not in {list(keys)}')
    return unnorm_key


def vla_parameters(policy, unnorm_key: str, sim_mode: str, control_rate_hz: float) -> dict:
    """The VLA node's parameter overrides for a closed loop with `policy`."""
    from vla_spec_ros.ros import params
    values = {spec.name: getattr(policy.config, spec.name) for spec in params.PARAMETERS
              if spec.target == 'engine'}     # tunables must not reset the policy's values
    values['draft_path'] = values['draft_path'] or ''
    values.update(matched_command_parameters(control_rate_hz, sim_mode)[0],
                  model_path=str(policy.source), unnorm_key=unnorm_key)
    return values


def bridge_parameters(image_size: int, sim_mode: str, control_rate_hz: float, max_steps: int,
                      camera: str, lockstep_timeout_s: float, action_delay: int = 0,
                      delay_hold: str = 'previous', delay_frames: str = 'every',
                      camera_delay: int = 0) -> dict:
    """The bridge's overrides, matching `vla_parameters` (period, scales, limits, gripper)."""
    # instruction_settle_s 0: the harness sets the VLA node's instruction synchronously.
    return dict(matched_command_parameters(control_rate_hz, sim_mode)[1],
                image_size=int(image_size), max_steps=int(max_steps), camera=camera,
                lockstep_timeout_s=float(lockstep_timeout_s), instruction_settle_s=0.0,
                action_delay=int(action_delay), delay_hold=delay_hold,
                delay_frames=delay_frames, camera_delay=int(camera_delay))


def check_policy_sim_mode(policy, sim_mode: str) -> int:
    """A chunked policy needs sim_mode realtime (module doc); its action_chunk, by the node's
    own rule (ros/model_io.chunk_steps_of)."""
    from vla_spec_ros.ros.model_io import chunk_steps_of
    chunk = chunk_steps_of(policy)
    if chunk > 1 and sim_mode == 'lockstep':
        raise ValueError(
            f'sim_mode: lockstep cannot run a chunked policy (action_chunk {chunk}): the node '
            'publishes a chunk\'s steps on its clock, one per control period, while lock-step '
            'steps the arm once per answered frame; use sim_mode realtime (or the delayed '
            'lock-step in process, harness/inprocess.py)')
    return chunk


def control_rate_range() -> tuple[float, float]:
    """Rates (Hz) whose period the VLA node's `control_period` parameter accepts."""
    from vla_spec_ros.ros.params import PARAMETERS_BY_NAME
    spec = PARAMETERS_BY_NAME['control_period']
    return 1.0 / spec.max_value, 1.0 / spec.min_value


def check_control_rate(control_rate_hz, name: str = 'control_rate_hz') -> float:
    """`control_rate_hz` as a float inside `control_rate_range()`, else ValueError(name)."""
    low, high = control_rate_range()
    if (isinstance(control_rate_hz, bool) or not isinstance(control_rate_hz, (int, float))
            or not low <= control_rate_hz <= high):
        raise ValueError(f'{name}: expected a rate in [{low:g}, {high:g}] Hz (the VLA node\'s '
                         f'control_period range), got {control_rate_hz!r}')
    return float(control_rate_hz)


def check_max_steps(max_steps, name: str = 'max_steps') -> int:
    """`max_steps` as an int in [1, MAX_EPISODE_STEPS], else ValueError(name)."""
    if (isinstance(max_steps, bool) or not isinstance(max_steps, int)
            or not 1 <= max_steps <= MAX_EPISODE_STEPS):
        raise ValueError(f'{name}: expected an int in [1, {MAX_EPISODE_STEPS}] (Meta-World\'s '
                         f'episode limit), got {max_steps!r}')
    return max_steps


def _check_args(tasks, episodes_per_task, sim_mode, control_rate_hz, max_steps) -> list[str]:
    if isinstance(tasks, str) or not tasks:
        raise ValueError(f'tasks: expected a non-empty list of task names, got {tasks!r}')
    names = [get_task(t).name for t in tasks]
    if not isinstance(episodes_per_task, int) or episodes_per_task < 1:
        raise ValueError(f'episodes_per_task: expected a positive int, got '
                         f'{episodes_per_task!r}')
    if sim_mode not in SIM_MODES:
        raise ValueError(f'sim_mode: {sim_mode!r} not in {list(SIM_MODES)}')
    check_control_rate(control_rate_hz)
    check_max_steps(max_steps)
    return names


def run_closed_loop(policy, tasks, episodes_per_task: int, seed: int = 0,
                    sim_mode: str = 'lockstep', control_rate_hz: float = 10.0,
                    max_steps: int = 150, unnorm_key: str | None = None, progress: bool = False,
                    *, camera: str = DEFAULT_CAMERA, lockstep_timeout_s: float = 5.0,
                    episode_timeout_s: float | None = None, namespace: str | None = None,
                    num_warmup_frames: int = 2, on_episode=None, action_delay: int = 0,
                    delay_hold: str = 'previous', delay_frames: str = 'every',
                    camera_delay: int = 0, log_level: str | None = None,
                    node_parameters: dict | None = None) -> ClosedLoopReport:
    """Run `episodes_per_task` episodes of each task with `policy` behind a real VLA node.

    `action_delay`, `delay_hold`, `delay_frames` (lock-step only): the bridge's delayed
    lock-step (delayed_lockstep.DelayedLockstep). `camera_delay` (real time only): frames published
    that many control periods after capture, stamp kept (realtime_clock.DelayedCamera). A chunked
    policy needs sim_mode 'realtime' (ValueError otherwise, before anything starts).
    `log_level` ('debug', 'info', 'warn', 'error'; None: ROS's default) sets the two nodes'
    loggers before they start: the demo passes 'warn' so that their start-up lines stay out of
    its output. `node_parameters` (e.g. {'chunk_blend': 'ensemble'}) override the VLA node's
    own parameters; the harness's matched ones (control period, scales, model) cannot be
    overridden (ValueError), and the node validates the values as at any start.
    `episode_timeout_s` (default 30 s + 5 s per step) ends an episode whose actions stop
    coming; it counts in `num_timeouts`. `on_episode(result, episode_log)` is called after each
    episode (tests read the applied actions from it). `namespace` (default: unique per call)
    holds both nodes, e.g. the VLA node's topics are `<namespace>/vla_spec/action`.
    `num_warmup_frames` blank frames go through `policy.predict` first (one-time costs), outside
    every statistic.
    """
    import rclpy
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from std_srvs.srv import Trigger

    from vla_spec_ros.ros.node import VLASpecNode
    from vla_spec_ros.ros.params import PARAMETERS_BY_NAME
    from vla_spec_ros.harness.node_threads import NodeThreads
    from vla_spec_ros.harness.sim_bridge import SimBridgeNode

    names = _check_args(tasks, episodes_per_task, sim_mode, control_rate_hz, max_steps)
    check_delay(action_delay, delay_hold, delay_frames)
    if action_delay and sim_mode != 'lockstep':
        raise ValueError('action_delay: applies to sim_mode lockstep only')
    check_camera_delay(camera_delay, sim_mode)
    chunk = check_policy_sim_mode(policy, sim_mode)
    key = _resolve_unnorm_key(policy, unnorm_key)
    node_values = vla_parameters(policy, key, sim_mode, control_rate_hz)
    clash = sorted(set(node_parameters or {}) & set(node_values))
    if clash:
        raise ValueError(f'node_parameters: {clash} are set by the harness (matched with the '
                         'simulator bridge or the policy)')
    node_values.update(node_parameters or {})
    size = policy.model_config.image_size
    for _ in range(num_warmup_frames):
        policy.predict(np.zeros((size, size, 3), np.uint8), get_task(names[0]).instructions[0],
                       key)
    timeout_s = episode_timeout_s or 30.0 + 5.0 * max_steps
    namespace = namespace or f'/closed_loop_{os.getpid()}_{next(_harness_ids)}'
    vla_ns = f'{namespace}/vla_spec'
    remaps = ['--ros-args'] + [arg for topic in ('image', 'instruction', 'twist', 'gripper')
                               for arg in ('-r', f'~/{topic}:={vla_ns}/{topic}')]
    report = ClosedLoopReport(policy.config.mode, policy.config.relax_threshold, sim_mode,
                              float(control_rate_hz), action_delay=int(action_delay),
                              delay_hold=delay_hold, delay_frames=delay_frames,
                              camera_delay=int(camera_delay), action_chunk=chunk,
                              chunk_blend=str(node_values.get(
                                  'chunk_blend', PARAMETERS_BY_NAME['chunk_blend'].default)))
    context = rclpy.Context()
    rclpy.init(context=context)
    nodes, spinning = [], None
    if log_level is not None:
        _set_log_level([f'{namespace}/vla_spec', f'{namespace}/sim_bridge'], log_level)
    try:
        vla = VLASpecNode(policy=policy, context=context, namespace=namespace,
                          parameter_overrides=[Parameter(k, value=v)
                                               for k, v in node_values.items()])
        nodes.append(vla)
        bridge_values = bridge_parameters(size, sim_mode, control_rate_hz, max_steps, camera,
                                          lockstep_timeout_s, action_delay, delay_hold,
                                          delay_frames, camera_delay)
        bridge = SimBridgeNode(context=context, namespace=namespace, cli_args=remaps,
                               parameter_overrides=[Parameter(k, value=v)
                                                    for k, v in bridge_values.items()])
        nodes.append(bridge)
        client_node = Node('closed_loop_client', context=context, namespace=namespace)
        nodes.append(client_node)
        reset_client = client_node.create_client(Trigger, f'{vla_ns}/reset')
        spinning = NodeThreads(context, [[vla], [bridge, client_node]], name='closed_loop')
        if not (bridge.wait_for_peers(PEER_TIMEOUT_S)
                and reset_client.wait_for_service(timeout_sec=PEER_TIMEOUT_S)):
            raise RuntimeError('the VLA node and the simulator bridge did not connect')
        forwards_before = policy.engine.num_verifier_forwards
        latencies = []
        for task_name in names:
            task = get_task(task_name)
            for episode in range(episodes_per_task):
                ep_seed = episode_seed(seed, task.name, episode)
                instruction = choose_instruction(task, ep_seed)
                _reset(reset_client, instruction, vla)
                actions_before = _actions_published(vla)
                chunks_before = _chunk_counts(vla)
                result = bridge.run_episode(task.name, ep_seed, instruction, timeout_s)
                log = bridge.episode_log()
                for name, count in _chunk_counts(vla).items():
                    setattr(report, name, getattr(report, name) + count - chunks_before[name])
                report.num_episode_actions += _episode_actions(vla, actions_before, log,
                                                               sim_mode)
                _accumulate(report, result, log)
                latencies.extend(log.latencies_s)
                if on_episode is not None:
                    on_episode(result, log)
                if progress:
                    print(f'[{report.mode} r={report.relax_threshold}] {task.name} '
                          f'#{episode}: {"success" if result.is_success else "failure"} in '
                          f'{result.num_steps} steps ({log.wall_s:.1f} s)', flush=True)
        snapshot = vla.stats_snapshot()
        report.num_actions = int(snapshot['actions_published'])     # the node is new
        if report.num_actions:
            report.forwards_per_action = ((policy.engine.num_verifier_forwards
                                           - forwards_before) / report.num_actions)
        if policy.config.is_speculative and snapshot['verify_steps']:
            # Mean tokens decided per verifier step over the whole run (the node is new).
            report.acceptance_length = snapshot['accepted_tokens'] / snapshot['verify_steps']
        report.latency_p50_ms = _percentile_ms(latencies, 50)
        report.latency_p99_ms = _percentile_ms(latencies, 99)
        if latencies:
            report.latency_mean_ms = 1e3 * sum(latencies) / len(latencies)
    finally:
        if spinning is not None:     # the spin threads end before any node is destroyed
            spinning.shutdown()
        for node in reversed(nodes):
            node.destroy_node()
        rclpy.try_shutdown(context=context)
    report.success_rate = success_rate(report.episodes)
    report.success_rate_per_task = {
        name: success_rate([e for e in report.episodes if e.task_name == name])
        for name in names}
    if report.wall_s > 0:
        # Only what was published while episodes ran, over the time they ran: resets,
        # warm-up and answers arriving between episodes stay out of the rate.
        report.actions_per_s = report.num_episode_actions / report.wall_s
    return report


def _set_log_level(node_paths, level: str) -> None:
    """Severity of the loggers of nodes `/ns/name` (their logger is `ns.name`)."""
    from rclpy.logging import LoggingSeverity, set_logger_level
    severity = {'debug': LoggingSeverity.DEBUG, 'info': LoggingSeverity.INFO,
                'warn': LoggingSeverity.WARN, 'error': LoggingSeverity.ERROR}
    if level not in severity:
        raise ValueError(f'log_level: {level!r} not in {list(severity)}')
    for path in node_paths:
        set_logger_level(path.strip('/').replace('/', '.'), severity[level])


# ClosedLoopReport field <- the node's stats_snapshot key (ros/diagnostics.py).
CHUNK_COUNTS = {'num_chunk_steps_published': 'chunk_steps_published',
                'num_chunk_steps_skipped': 'chunk_steps_skipped',
                'num_chunks_replaced': 'chunks_replaced', 'num_chunk_run_outs': 'chunk_run_outs',
                'num_chunks_refused': 'chunks_refused'}


def _chunk_counts(vla) -> dict:
    snapshot = vla.stats_snapshot()
    return {field_name: int(snapshot[key]) for field_name, key in CHUNK_COUNTS.items()}


def _actions_published(vla) -> int:
    return int(vla.stats_snapshot()['actions_published'])


def _episode_actions(vla, before: int, log, sim_mode: str) -> int:
    """Actions the VLA node published since `before` (sampled right before the episode).

    The node counts an action just after publishing it, so the bridge may end a lock-step
    episode on the last command before that count moves. Every command applied in lock-step is
    a distinct published action, a lower bound the count reaches within moments; wait for it
    (bounded). Real time has no such bound: the count is taken as it is.
    """
    num_actions = _actions_published(vla) - before
    if sim_mode == 'lockstep':
        deadline = time.monotonic() + ACTION_COUNT_TIMEOUT_S
        while (num_actions < log.counters.num_commands_applied
               and time.monotonic() < deadline):
            time.sleep(0.002)
            num_actions = _actions_published(vla) - before
    return num_actions


def _reset(reset_client, instruction: str, vla) -> None:
    """Drop the VLA node's in-flight work, then give it the next instruction."""
    from rclpy.parameter import Parameter
    from std_srvs.srv import Trigger

    future = reset_client.call_async(Trigger.Request())
    deadline = time.monotonic() + SERVICE_TIMEOUT_S
    while not future.done():
        if time.monotonic() > deadline:
            raise RuntimeError('the VLA node did not answer ~/reset')
        time.sleep(0.002)
    result = vla.set_parameters([Parameter('instruction', value=instruction)])[0]
    if not result.successful:
        raise ValueError(f'instruction: refused by the VLA node: {result.reason}')


def _accumulate(report: ClosedLoopReport, result: EpisodeResult, log) -> None:
    counters = log.counters
    report.episodes.append(result)
    report.num_steps += counters.num_steps
    report.wall_s += log.wall_s
    report.num_stale_commands += counters.num_stale_commands
    report.num_republished_frames += counters.num_republished_frames
    report.num_timeouts += int(counters.is_timed_out)
    report.num_unanswered += int(counters.is_unanswered)
    report.num_late_ticks += counters.num_late_ticks
    report.num_hold_commands += counters.num_hold_commands
    for name in ('num_answer_steps', 'answer_lag_sum', 'num_answer_steps_on_time',
                 'num_answer_steps_early'):
        setattr(report, name, getattr(report, name) + getattr(counters, name))
    if report.sim_mode == 'realtime':
        gap_ms = 1e3 * counters.max_tick_gap_s
        report.max_tick_gap_ms = (gap_ms if math.isnan(report.max_tick_gap_ms)
                                  else max(report.max_tick_gap_ms, gap_ms))


__all__ = ['ClosedLoopReport', 'run_closed_loop', 'vla_parameters', 'bridge_parameters',
           'control_rate_range', 'check_control_rate', 'check_max_steps', 'MAX_EPISODE_STEPS',
           'check_policy_sim_mode']
