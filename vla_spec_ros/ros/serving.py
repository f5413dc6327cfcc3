"""What a loaded `vla_spec` node runs: its robots' channels, the worker, timers, parameters.

Shared by the plain node (ros/node.py: built in the constructor, active at once) and the
managed node (ros/lifecycle_node.py: built in on_configure, active between on_activate and
on_deactivate). Neither the model loading nor the ROS node class lives here.

Parameter changes: `validate(changes)` (on-set callback, no side effects) refuses load-time
parameters and invalid values (parameter_checks.py: what a change must fit beyond its
range; model_io.py: what the checkpoint reads); `apply(changes)` (post-set callback)
rebuilds the settings of every robot for the next frame and queues engine tunables, which the
worker applies before its next submit (a request keeps the tunables it was submitted with).

A chunked model (action_chunk K > 1) also gets the chunk clock (chunk_clock.py), which publishes
each robot's chunk one step per control period (docs/chunks.md).

Stopping leaves every robot still: deactivation (`set_active(False)`) and the end of the
process (`stop`) send each robot's hold (zero twist and the other outputs' holds) after the
last action the worker or the chunk clock publishes, never before one: deactivation pauses the
worker and drops the chunks around its holds, `stop` ends both threads first and then waits,
at most STOP_ACK_TIMEOUT_S, until reliable subscribers have acknowledged the holds.
"""
from __future__ import annotations

import contextlib
import threading
import time

from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.msg import SetParametersResult
from rclpy.parameter import Parameter

from vla_spec_ros.engine.result import Frame
from vla_spec_ros.ros import twist_messages, diagnostics, params
from vla_spec_ros.ros.gc_pauses import GcPauses, freeze_after_load, unfreeze
from vla_spec_ros.ros.late_callbacks import tolerating_destroyed
from vla_spec_ros.ros.qos import COMMAND_QOS
from vla_spec_ros.ros.robot_channel import RobotChannel
from vla_spec_ros.ros.robot_recordings import RobotRecordings
from vla_spec_ros.ros.chunk_clock import ChunkClock
from vla_spec_ros.ros.command_rules import REASON_DISABLED, has_instruction
from vla_spec_ros.ros.model_io import check_model_io, chunk_steps_of, model_io_of
from vla_spec_ros.ros.parameter_checks import (check_joint_count, check_pose_frame,
                                               check_state_size, check_unnorm_key)
from vla_spec_ros.ros.node_clock_watch import NodeClockWatch, steady_clock
from vla_spec_ros.ros.worker import InferenceWorker

# /diagnostics' reason while a managed node is configured but not active, and once activated
# until its first action or hold (not "publishing actions": it is not).
INACTIVE_REASON = 'inactive: configured, not activated (lifecycle)'
ACTIVATED_REASON = 'activated: no action yet'

WARM_UP_IMAGE_SIZE = 224
WARM_UP_STREAM = '__warm_up__'      # the engine stream of the warm-up's throw-away frames
STOP_ACK_TIMEOUT_S = 1.0            # how long `stop` waits for the holds to be acknowledged


class Serving:
    """Channels (one per robot), the inference worker and the timers of one loaded node.

    `values`: every parameter value after overrides (params.declare_parameters); `config`:
    the configuration the node built from them (params.configuration_from_parameters), the
    one its policy was loaded with. A parameter change builds the next one from `values`.
    """

    def __init__(self, node, policy, values: dict, config: params.Configuration, *,
                 is_active: bool, enable_services: bool = True):
        self.node = node
        self.policy = policy
        self.engine = policy.engine
        self.values = dict(values)
        self.config = config
        self.unnorm_keys = tuple(policy.unnorm_keys)
        self.chunk_steps = chunk_steps_of(policy)
        self.model_io = model_io_of(policy)
        self._check_robots(config)               # before anything is created
        self.engine_lock = threading.Lock()
        # A policy passed in (tests, embedding) was loaded with its own config: the tunable
        # parameters still apply, from the first frame.
        self._pending_tunables = params.tunable_engine_changes(self.engine.config,
                                                               config.engine)
        self.engine.check_tunables(**self._pending_tunables)     # refused at start-up, not
        # at the first frame as an engine error
        self._tunables_lock = threading.Lock()
        self.recordings = RobotRecordings(node, config.robots)
        self.chunk_clock = self._make_chunk_clock()
        self.clock_watch = NodeClockWatch(node.get_clock())
        wakeup = threading.Event()
        self.channels = []
        try:
            for robot, settings in config.robots.items():
                self.channels.append(RobotChannel(
                    node, robot, settings, wakeup=wakeup, on_instruction=self._on_instruction,
                    on_enable=self._on_enable, on_reset=self._on_reset,
                    chunk_steps=self.chunk_steps,
                    on_chunk=self.chunk_clock and self.chunk_clock.wake,
                    action_dim=self.model_io.action_dim,
                    model_reads_state=self.model_io.uses_state,
                    writes_reasoning=self.model_io.writes_reasoning,
                    paused=self._worker_paused, clock_watch=self.clock_watch,
                    enable_service=enable_services))
        except Exception:    # a robot that cannot be served leaves no topic of the others,
            for channel in self.channels:       # and no recording open
                channel.destroy()
            self.recordings.close()
            raise
        for channel in self.channels:
            channel.is_active = is_active
            if not is_active:       # /diagnostics must not say "publishing actions" meanwhile
                channel.stats.set_hold_reason(INACTIVE_REASON)
        self._frozen = False         # freeze_after_load called by warm_up, not yet undone
        self.gc_pauses = None        # made last: nothing below can fail and leave it registered
        self._diag_pub = node.create_publisher(DiagnosticArray, '/diagnostics', COMMAND_QOS)
        self._timers = self._start_timers(node)
        self.worker = InferenceWorker(self.engine, self.channels, self.engine_lock, wakeup,
                                      self._take_tunables, self._on_submitted)
        self.worker.start()
        if self.chunk_clock is not None:
            self.chunk_clock.channels = list(self.channels)
            self.chunk_clock.start()
        # Every garbage collection's pause, for /diagnostics (gc_pauses.py).
        self.gc_pauses = GcPauses(window_s=self.channels[0].stats.window_s)

    def _start_timers(self, node) -> list:
        """The watchdog's and /diagnostics' timers, on the steady clock: a timer on the node
        clock stops while that clock stands (sim time without /clock) and, on the system
        clock, for as long as the clock was stepped back (rcl's timers do not handle a
        backward step): the watchdog must run exactly then."""
        return [node.create_timer(self.settings.watchdog_period,
                                  tolerating_destroyed(self._on_watchdog), clock=steady_clock()),
                node.create_timer(self.settings.diagnostics_period,
                                  tolerating_destroyed(self._publish_diagnostics),
                                  clock=steady_clock())]

    def _worker_paused(self):
        """The worker's `paused()` (no turn runs inside), or nothing before it exists."""
        worker = getattr(self, 'worker', None)
        return worker.paused() if worker is not None else contextlib.nullcontext()

    def _check_robots(self, config: params.Configuration) -> None:
        """Refuse (ValueError naming the parameter) robots the engine or the checkpoint
        cannot serve: more than max_streams, an unknown unnorm_key, inputs or an action
        space that do not fit the model."""
        if len(config.node.robots) > self.engine.config.max_streams:
            raise ValueError(f'robots: {len(config.node.robots)} robots but the engine '
                             f'serves at most max_streams={self.engine.config.max_streams}')
        for settings in config.robots.values():
            check_unnorm_key(settings.unnorm_key, self.unnorm_keys)
            check_model_io(self.model_io, settings, self.node.get_logger())

    def _make_chunk_clock(self):
        """The chunk clock of a chunked model (chunk_clock.py), else None."""
        if self.chunk_steps <= 1:
            return None
        if twist_messages.MultiDOFJointTrajectory is None:
            self.node.get_logger().warning(
                f'action_chunk {self.chunk_steps}: trajectory_msgs is not importable, so no '
                'trajectory topic; the steps are published on twist as usual')
        return ChunkClock(self.node)

    # ---- state ------------------------------------------------------------------------------

    @property
    def settings(self) -> params.NodeSettings:
        """The node-wide settings in force (each robot's own: its channel's `settings`)."""
        return self.config.node

    @property
    def engine_config(self):
        """The EngineConfig the parameters say (the engine takes its tunables from it before
        its next submit)."""
        return self.config.engine

    @property
    def is_multi_robot(self) -> bool:
        return bool(self.settings.robots)

    def set_active(self, is_active: bool, reason: str = '') -> None:
        """Start or stop acting. Stopping sends each robot's hold once (`reason`) and drops
        every queued frame, chunk and engine request: the worker is paused meanwhile, so no
        action follows the hold, and nothing decided before it is published after."""
        if is_active:
            for channel in self.channels:
                channel.is_active = True
                if channel.stats.hold_reason == INACTIVE_REASON:
                    channel.stats.set_hold_reason(ACTIVATED_REASON)
            return
        with self.worker.paused():
            self._hold_last(reason or 'deactivated')
        self.release_engine()

    def _hold_last(self, reason: str) -> None:
        """(The worker paused or stopped.) Every robot's queued frame and chunks dropped, so
        the chunk clock has nothing left to publish; then its hold; then inactive."""
        for channel in self.channels:
            channel.slot.clear()
            channel.clear_chunks()
        for channel in self.channels:
            channel.send_hold(reason)
        for channel in self.channels:
            channel.is_active = False

    def stop(self, reason: str = 'shutting down') -> None:
        """The process is ending (SIGINT, SIGTERM, lifecycle shutdown): no frame is taken and
        no action published any more, each active robot's hold goes out last, and the node
        waits (at most STOP_ACK_TIMEOUT_S) until reliable subscribers acknowledged it, so
        the robot is left still. `destroy` may follow."""
        if not self.worker.stop():
            self.node.get_logger().error('the inference worker did not stop in time: an '
                                         'action still in the engine is not published, but '
                                         'its frame may be lost')
        if self.chunk_clock is not None:
            self.chunk_clock.stop()
        for timer in self._timers:
            timer.cancel()                     # the watchdog's holds would follow the last
        self._hold_last(reason)
        self.release_engine()
        wait_for_acknowledgements(self.node, STOP_ACK_TIMEOUT_S)

    @property
    def engine_streams(self) -> tuple[str, ...]:
        """The engine streams this node submits to: one per robot, and the warm-up's."""
        return tuple(channel.stream_id for channel in self.channels) + (WARM_UP_STREAM,)

    def release_engine(self) -> list[int]:
        """Drop this node's waiting and in-flight frames from the engine (its results would
        reach no robot). Only this node's streams: a policy shared with another node or with
        ``VLAPolicy.predict`` keeps their frames. Returns the dropped request ids."""
        with self.engine_lock:
            return [request_id for stream in self.engine_streams
                    for request_id in self.engine.reset(stream)]

    def warm_up(self) -> None:
        """Throw-away inferences before the first real frame, so the first actions are not
        the slowest: with use_cuda_graphs every verifier step shape is captured first; in the
        pipeline modes a burst of 2 x max_inflight frames then runs through the engine (it
        fills the pipeline in "pipeline"; pipeline_spec's frames finish sooner), which meets
        (and, with graphs, captures) the draft shapes of the request counts it reaches."""
        instruction = self.settings.instruction
        frame = self._placeholder_frame(
            self.settings, instruction if has_instruction(instruction) else 'warm up',
            WARM_UP_IMAGE_SIZE)
        config = self.engine.config
        count = 2 * config.max_inflight if config.is_pipelined else 1
        with self.engine_lock:
            self.engine.capture_graphs(frame)
            for _ in range(count):
                self.engine.submit(frame)
            self.engine.run_until_idle()
        # What is loaded now lives as long as the node: no full collection walks it again
        # (a 150 ms pause otherwise; gc_pauses.py).
        if not self._frozen:         # (warm_up runs once per serving; a second call re-warms)
            frozen = freeze_after_load()
            self._frozen = True
            self.node.get_logger().debug(f'{frozen} objects frozen for the collector')
        self.gc_pauses.clear()       # the load's own collections are not pauses of serving

    def destroy(self) -> None:
        """Stop serving and leave the engine idle of this node's frames: the worker stops
        (no new step), then every frame it submitted is dropped, so a policy reused after the
        node (the demo's next row, ``predict``) starts from an idle engine whatever the
        timing of the last frame."""
        self.worker.stop()
        self.release_engine()
        self.gc_pauses.close()
        if self._frozen:
            unfreeze()               # the model can be freed once the node lets go of it
            self._frozen = False
        if self.chunk_clock is not None:
            self.chunk_clock.stop()
        for timer in self._timers:
            self.node.destroy_timer(timer)
        for channel in self.channels:
            channel.destroy()
        self.node.destroy_publisher(self._diag_pub)
        self.recordings.close()

    def stats_snapshot(self, robot: str = '') -> dict:
        channel = next(c for c in self.channels if c.name == robot)
        return channel.stats.snapshot(time.monotonic())

    # ---- parameters -------------------------------------------------------------------------

    def validate(self, changes) -> SetParametersResult:
        """On-set callback: refuse load-time changes and invalid values (no side effects)."""
        proposed = dict(self.values)
        for change in changes:
            if change.name not in proposed:
                continue       # use_sim_time and other rclpy-owned parameters
            refusal = params.change_refusal(
                change.name, change.value, change.type_ == Parameter.Type.NOT_SET,
                self.values, tuple(self.settings.robots))
            base_name = change.name.split('.', 1)[-1]     # '<robot>.<name>' -> '<name>'
            if (refusal is None and base_name in params.LOAD_TIME_PARAMETERS
                    and change.value != self.values[change.name]):
                refusal = params.load_time_refusal(change.name)
            if refusal is not None:
                return SetParametersResult(successful=False, reason=refusal)
            proposed[change.name] = change.value
        try:
            config = params.configuration_from_parameters(proposed)
            for robot, robot_settings in config.robots.items():
                current = self.config.robots[robot]
                try:
                    check_unnorm_key(robot_settings.unnorm_key, self.unnorm_keys)
                    check_joint_count(robot_settings, current, self.model_io.action_dim)
                    check_pose_frame(robot_settings, current)
                    check_state_size(robot_settings, current, self.model_io.uses_state,
                                     lambda settings: self._check_frame_of(
                                         settings, 'check the state'))
                except ValueError as exc:   # '<name>: why' -> '<robot>.<name>: why'
                    if not robot:
                        raise
                    raise ValueError(params.robot_parameter_name(robot, str(exc))) from None
            # The engine's own checks, now: queued unchecked, a tunable this model or load
            # cannot take failed in the worker as an engine error (every robot held, the
            # engine reset, the other tunables of the change dropped) while the parameter
            # kept the value the engine never ran.
            with self._tunables_lock:
                queued = dict(self._pending_tunables)
            self.engine.check_tunables(**{**queued, **params.tunable_engine_changes(
                self.config.engine, config.engine)})
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _placeholder_frame(self, settings, instruction: str, image_size: int) -> Frame:
        """A black frame of a robot with `settings` (its image slots, dataset, a zero state
        of its size when the model reads one) under `instruction`: the warm-up's, and what
        `_check_frame_of` shows the engine."""
        import numpy as np

        image = np.zeros((image_size, image_size, 3), np.uint8)
        slots = settings.num_image_slots
        state = (np.zeros(len(settings.state_order), np.float64)
                 if self.model_io.uses_state and settings.state_order else None)
        return Frame(image if slots == 1 else (image,) * slots, instruction,
                     settings.unnorm_key_or_none or self.unnorm_keys[0], WARM_UP_STREAM,
                     state=state)

    def _check_frame_of(self, settings, instruction: str) -> None:
        """ValueError when the engine would refuse every frame of a robot with `settings`
        and `instruction` whatever its camera sends (the state's size, the instruction)."""
        frame = self._placeholder_frame(settings, instruction, 8)
        with self.engine_lock:
            self.engine.check_frame(frame)

    def _say_if_unusable(self, channel) -> None:
        """A new instruction the engine refuses (too long for max_instruction_tokens, say) is
        kept, and the robot holds on every frame (a refused instruction would leave the old
        task running): said once, now, naming the parameter."""
        instruction = channel.settings.instruction
        if not has_instruction(instruction):
            return
        try:
            self._check_frame_of(channel.settings, instruction)
        except ValueError as exc:
            self.node.get_logger().error(
                f'{channel.label}: {self._parameter_name(channel, "instruction")}: {exc}; '
                'every frame is refused and the robot holds until an instruction it can use')

    def apply(self, changes) -> None:
        """Post-set callback: new settings for the next frame; engine tunables are queued."""
        for change in changes:
            if change.name in self.values:
                self.values[change.name] = change.value
        config = params.configuration_from_parameters(self.values)
        with self._tunables_lock:
            self._pending_tunables.update(
                params.tunable_engine_changes(self.config.engine, config.engine))
        self.config = config
        for channel in self.channels:
            before = channel.replace_settings(config.robots[channel.name])
            if before.enabled != channel.settings.enabled:
                self.node.get_logger().info(
                    f'{channel.label}: {"enabled" if channel.settings.enabled else "disabled"}')
                if not channel.settings.enabled:
                    # With the worker paused (it finishes its turn first): an action it was
                    # publishing as the disable came goes out before the hold below, never
                    # after the disable has returned (robot_channel.forget_commands).
                    with self._worker_paused():
                        channel.slot.clear()
                        channel.clear_chunks()
                        # ... and what the engine holds of it: its frames in flight and a kept
                        # reasoning (reasoning_every_n), which must not steer the robot after
                        # a pause in a scene that has changed meanwhile.
                        self._on_reset(channel)
                        channel.send_hold(REASON_DISABLED)
            if before.instruction != channel.settings.instruction:
                channel.instruction_changed()
                self._say_if_unusable(channel)
            if before.state_order != channel.settings.state_order:
                channel.observation.forget_inputs()

    def _take_tunables(self) -> dict:
        with self._tunables_lock:
            pending, self._pending_tunables = self._pending_tunables, {}
        return pending

    def _parameter_name(self, channel, name: str) -> str:
        return params.robot_parameter_name(channel.name, name) if channel.name else name

    def _on_instruction(self, channel, text: str) -> None:
        name = self._parameter_name(channel, 'instruction')
        result = self.node.set_parameters([Parameter(name, value=text)])[0]
        if not result.successful:
            self.node.get_logger().warning(f'{channel.label}: instruction refused: '
                                           f'{result.reason}')

    def _on_enable(self, channel, flag: bool) -> tuple[bool, str]:
        """`~/enable` is `ros2 param set <node> enabled`, in every state: an inactive managed
        node keeps the value and acts on it once activated (docs/node.md)."""
        name = self._parameter_name(channel, 'enabled')
        result = self.node.set_parameters([Parameter(name, value=flag)])[0]
        if not result.successful:
            return False, result.reason
        message = 'enabled' if flag else 'disabled'
        if not channel.is_active:
            message += (' (the node is inactive: it acts once activated)' if flag
                        else ' (the node is inactive)')
        return True, message

    def _on_reset(self, channel) -> int:
        with self.engine_lock:
            return len(self.engine.reset(channel.stream_id if self.is_multi_robot else None))

    # ---- timers -----------------------------------------------------------------------------

    def _on_watchdog(self) -> None:
        for channel in self.channels:
            if channel.is_active:
                channel.watchdog()

    def engine_summary(self) -> dict:
        """The engine over the window of every robot it serves (enabled and active: a
        disabled robot's camera frames are received but never meant for the engine, so it is
        neither the least-answered robot nor part of the totals): totals, least-answered
        robot, saturated; and the process's garbage collections in the same window (count,
        full ones, longest)."""
        now = time.monotonic()
        snapshots = {channel.label: channel.stats.snapshot(now) for channel in self.channels
                     if channel.is_active and channel.settings.enabled}
        # (None only while __init__ runs, if a multi-threaded executor fires the timer then)
        pauses = self.gc_pauses.snapshot(now) if self.gc_pauses is not None else {}
        return dict(diagnostics.engine_summary(snapshots, self.channels[0].stats.window_s),
                    **pauses)

    def _publish_diagnostics(self) -> None:
        """One status per robot, then the engine's (saturated: WARN); also closes the
        recorders' due splits, so a robot whose camera stopped has its last frames on disk."""
        array = DiagnosticArray()
        array.header.stamp = self.node.get_clock().now().to_msg()
        array.status = [channel.diagnostic(self.engine.config.mode)
                        for channel in self.channels]
        array.status.append(diagnostics.engine_status(
            self.engine_summary(), name=f'{self.node.get_fully_qualified_name()}: engine',
            hardware_id=self.settings.model_path))
        self._diag_pub.publish(array)
        self.recordings.close_due_splits()

    def _on_submitted(self, channel, frame: Frame) -> None:
        self.recordings.record(channel.name, channel.settings, frame)


def wait_for_acknowledgements(node, timeout_s: float) -> bool:
    """Wait until every subscriber of `node`'s reliable publishers has acknowledged what was
    published (best-effort ones are done at once), `timeout_s` in all; whether all were."""
    from rclpy.duration import Duration

    deadline = time.monotonic() + timeout_s
    for publisher in list(node.publishers):
        remaining = deadline - time.monotonic()
        if remaining <= 0.0:
            return False
        try:
            if not publisher.wait_for_all_acked(Duration(nanoseconds=int(remaining * 1e9))):
                return False
        except Exception:          # a publisher destroyed meanwhile, a context shut down
            return False
    return True


__all__ = ['Serving', 'wait_for_acknowledgements']
