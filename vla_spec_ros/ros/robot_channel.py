"""One robot's side of the node: wires its inputs, its safety gate and its output adapters.

A node serves one robot (today's `~/image`, `~/twist`, ... names) or several (`robots`
parameter: `<name>/image`, `<name>/twist`, ... one RobotChannel each) from one engine. What is
per robot lives in one file per concern:

  observation_input.py  image subscriptions -> depth-1 frame slot (frame_slot.py), with the
                        paired inputs read at each set's time; an image stamped in the
                        future is refused on arrival, a jump back of the node clock resets
                        the robot (clock_jumps.py)
  input_adapter.py      the interface of every paired input; one adapter per input
                        (listed in robot_io.py's `build_inputs`): state_input.py
                        (JointState or an array)
  safety_gate.py        the hold state machine: hold states with a message budget, holds that
                        always go out, refused frames and the results they supersede
  output_adapter.py     the interface of every output; one adapter per output
                        (listed in robot_io.py's `build_outputs`):
                        twist_output.py (TwistStamped + velocity trajectory),
                        joint_outputs.py (JointJog, JointTrajectory),
                        gripper_output.py (gripper topic + action goals),
                        raw_action_output.py (the raw action),
                        pose_output.py (absolute tool targets, from tool_pose.py),
                        reasoning_output.py (a reasoning policy's text on ~/reasoning)
  chunk_execution.py    a chunked model's chunks, kept and published step by step (its
                        rules: chunk_rules.py; its thread: chunk_clock.py)
  servo_contract.py     MoveIt Servo's command type, pause and timeout (servo_node)
  channel_stats.py      the statistics of answered frames and the /diagnostics status
  hold_log.py           which hold and refusal reasons reach the log (per robot, per reason)
  this file             services, the decision on each finished frame, and fanning decided
                        commands, chunks, steps and holds out to the adapters; what the
                        robot was doing is forgotten with a hold at once (the worker paused)
                        on `~/reset`, a clock jump and a new or cleared instruction, and a
                        single-step command whose image grew too old does not stand

Its settings are a NodeSettings built from the node's parameters overlaid with the robot's own
(`<name>.frame_id`, ...; params.robot_settings). The node swaps them in on `ros2 param set`.
Publishing is gated by `is_active` (a lifecycle node keeps it False until activated).
"""
from __future__ import annotations

import contextlib
import math
import threading

from std_msgs.msg import String
from std_srvs.srv import SetBool, Trigger

from vla_spec_ros.ros import command_rules as cmd
from vla_spec_ros.ros.channel_stats import record_answer, robot_status
from vla_spec_ros.ros.chunk_execution import ChunkChannel, ChunkExecution
from vla_spec_ros.ros.chunk_rules import chunk_age_limit
from vla_spec_ros.ros.command_listeners import add_listener_status
from vla_spec_ros.ros.control_steps import ControlSteps
from vla_spec_ros.ros.diagnostics import InferenceStats
from vla_spec_ros.ros.frame_slot import FrameInfo, LatestFrameSlot
from vla_spec_ros.ros.hold_log import HoldLog
from vla_spec_ros.ros.late_callbacks import tolerating_destroyed
from vla_spec_ros.ros.node_clock_watch import NodeClockWatch
from vla_spec_ros.ros.observation_input import ObservationInput
from vla_spec_ros.ros.pose_output import PoseTargetOutput
from vla_spec_ros.ros.qos import instruction_subscriptions
from vla_spec_ros.ros.robot_io import build_inputs, build_outputs
from vla_spec_ros.ros.reasoning_output import ReasoningOutput
from vla_spec_ros.ros.safety_gate import SafetyGate
from vla_spec_ros.ros.twist_output import TwistOutput


class RobotChannel:
    """The interfaces and state of one robot (see the module docstring).

    `name`: '' for the single-robot node (private topics `~/image`, ...), else the robot's name
    (topics `<name>/image`, ...). `stream_id` is the engine stream of its frames.
    `on_instruction(channel, text)` and `on_enable(channel, flag) -> (ok, message)` route the
    topic and service to the node, which owns the parameters; `on_reset(channel) -> int`
    drops this robot's engine requests.

    `chunk_steps`: the model's action_chunk K. With K > 1 a finished frame's chunk is kept by
    `chunk_execution` (chunk_execution.py) and its steps are published by `publish_due_step`,
    which the node's chunk clock calls at every slot start (`on_chunk()` wakes it when a chunk
    arrives).
    """

    def __init__(self, node, name: str, settings, *, wakeup: threading.Event,
                 on_instruction, on_enable, on_reset, chunk_steps: int = 1, on_chunk=None,
                 action_dim: int = cmd.ACTION_DIM, model_reads_state: bool = False,
                 writes_reasoning: bool = False, paused=contextlib.nullcontext,
                 clock_watch: NodeClockWatch | None = None, enable_service: bool = True):
        self.node = node
        # Whether the node clock can age frames at all (sim time's /clock: node_clock_watch.py)
        self.clock_watch = clock_watch or NodeClockWatch(node.get_clock())
        # `paused()`: a context in which the inference worker runs no turn (it waits for the one
        # in progress), so nothing it decided can be published after a hold sent inside.
        self._paused = paused
        self.name = name
        self.stream_id = name or 'default'
        self.settings = settings
        self.servo = None                         # ServoContract, with servo_node set
        self.is_active = True
        self.stats = InferenceStats()
        self.slot = LatestFrameSlot(wakeup)
        self.gate = SafetyGate()
        self.hold_log = HoldLog()                 # this robot's reasons in the log (hold_log.py)
        self._on_instruction, self._on_enable, self._on_reset = on_instruction, on_enable, on_reset
        # False: the node offers `<prefix>enable` itself (the managed node, in every state)
        self._enable_service = enable_service
        self.chunk_steps = int(chunk_steps)
        self.action_dim = int(action_dim)     # the checkpoint's (command_rules.check_action_dim)
        self.model_reads_state = model_reads_state     # the Frame carries the state
        self.chunk_execution = ChunkExecution(self._chunk_channel(), on_chunk)
        self._control_steps = ControlSteps()      # the images' steps, for temporal drafting
        # A single-step model's last command while it stands (no hold since): its frame's
        # FrameInfo, so the watchdog holds once that image is too old (a late engine).
        self._standing: FrameInfo | None = None

        prefix = f'{name}/' if name else '~/'
        self._built = []         # what this channel created, destroyed if it fails midway
        try:
            self._build(node, prefix, settings, writes_reasoning)
        except Exception:
            for destroy in reversed(self._built):
                destroy()
            raise

    def _build(self, node, prefix: str, settings, writes_reasoning: bool) -> None:
        """The channel's inputs, outputs, Servo contract, subscriptions and services (each
        registered in `_built` once created, for a failure midway)."""
        self.observation = ObservationInput(node, prefix, settings, self._on_frame,
                                            self.stats.record_dropped, self.current_settings,
                                            on_refused=self._on_refused_frame,
                                            on_clock_jump=self._on_clock_jump,
                                            on_out_of_order=self._on_out_of_order,
                                            inputs=build_inputs(node, prefix, settings,
                                                                self.current_settings))
        self._built.append(self.observation.destroy)
        self.outputs = build_outputs(node, prefix, settings, self.label,
                                     is_chunked=self.is_chunked,
                                     current_positions=self.observation.current_positions,
                                     writes_reasoning=writes_reasoning)
        self._built.extend(output.destroy for output in self.outputs)
        # A reasoning policy's text on ~/reasoning (reasoning_output.py), else None.
        self.reasoning_output = next((o for o in self.outputs
                                      if isinstance(o, ReasoningOutput)), None)
        self.twist_output = self.outputs[0] if isinstance(self.outputs[0], TwistOutput) else None
        # The absolute-target output (pose_output.py) when pose_targets is on, else None.
        self.pose_output = next((o for o in self.outputs
                                 if isinstance(o, PoseTargetOutput)), None)
        if settings.servo_node:
            from vla_spec_ros.ros.servo_contract import ServoContract

            self.servo = ServoContract(node, settings.servo_node, settings.servo_command_type,
                                       self.label, pause_on_hold=settings.servo_pause_on_hold,
                                       measure=self._servo_measure)
            self._built.append(self.servo.destroy)
            # Inactive until the owner sets is_active (the plain node at once, the managed
            # node on activate): a configured node leaves Servo alone.
        self._instruction_subs = []     # latched and plain publishers alike (ros/qos.py)
        for qos, events in instruction_subscriptions():
            self._instruction_subs.append(node.create_subscription(
                String, prefix + 'instruction', tolerating_destroyed(self._on_instruction_msg),
                qos, event_callbacks=events))
            self._built.append(lambda sub=self._instruction_subs[-1]:
                               node.destroy_subscription(sub))
        self._services = [node.create_service(Trigger, prefix + 'reset', self._on_reset_srv)]
        if self._enable_service:
            self._services.append(node.create_service(SetBool, prefix + 'enable',
                                                      self._on_enable_srv))

    @property
    def label(self) -> str:
        return self.name or self.node.get_name()

    @property
    def is_active(self) -> bool:
        return self._is_active

    @is_active.setter
    def is_active(self, value: bool) -> None:
        """Activation (re)selects Servo's command type (servo_contract.py)."""
        self._is_active = bool(value)
        if self.servo is not None:
            self.servo.set_active(self._is_active)

    @property
    def newest(self) -> FrameInfo | None:
        """The newest observation received (for the watchdog's staleness check)."""
        return self.observation.newest

    def _servo_measure(self):
        """(frame -> command latency p99 in s or None, control_period) for the Servo check."""
        import time

        latency_ms = self.stats.snapshot(time.monotonic()).get('latency_p99_ms', math.nan)
        return (None if math.isnan(latency_ms) else latency_ms * 1e-3,
                self.settings.control_period)

    @property
    def is_chunked(self) -> bool:
        return self.chunk_steps > 1

    def current_settings(self):
        """The robot's NodeSettings in force (swapped on `ros2 param set`)."""
        return self.settings

    def _chunk_channel(self) -> ChunkChannel:
        """What chunk_execution.py may use of this channel (its ChunkChannel)."""
        return ChunkChannel(
            num_steps=self.chunk_steps, action_dim=self.action_dim, stats=self.stats,
            settings=self.current_settings, is_active=lambda: self.is_active,
            now_s=self.now_s, prepare=self.prepare, publish_chunk=self.publish_chunk,
            publish_step=self.publish_step, reject=self.reject, log_reason=self.log_reason)

    # ---- callbacks (executor thread) ------------------------------------------------------

    def _on_frame(self, item) -> None:
        self.stats.record_received()
        if self.is_active and self.settings.enabled and self.slot.put(item):
            self.stats.record_dropped()

    def _on_refused_frame(self, info: FrameInfo, reason: str) -> None:
        """An image refused on arrival (stamped in the future, or a negative stamp,
        observation_input.py): held for at once, a future one counted stale (as the worker
        counts a future image it takes); it never reaches the slot, so a good frame waiting
        there still goes to the engine."""
        self.stats.record_received()
        if not (self.is_active and self.settings.enabled):
            return
        if cmd.reason_kind(reason) == cmd.REASON_BAD_INPUT:
            self.refuse(info, reason)          # and no command for an older image after it
        else:
            self.reject(reason, is_stale=cmd.is_stale_reason(reason))

    def _on_out_of_order(self, info: FrameInfo, slot_label: str) -> None:
        """An image dropped on arrival because its stamp is not newer than the previous one of
        its slot: counted apart from the frames a busy engine had no time for, and logged
        (throttled), since only the camera's clock or driver can cause it."""
        self.stats.record_received()          # received, though not answered
        self.stats.record_out_of_order()
        self.log_reason(f'image dropped{slot_label}: its stamp {info.stamp_s:.3f} s is not '
                        'newer than the previous image\'s (duplicate stamps, or the camera\'s '
                        'clock stepped back)', 'warning')

    def _on_clock_jump(self, jump) -> None:
        """The node clock went back (clock_jumps.py): everything of this robot kept on the old
        time line goes, as with `~/reset` (engine requests, the queued frame, the chunks; the
        frame order is already forgotten), so the frames after the jump are answered."""
        with self._paused():
            num_dropped, num_queued = self._drop_requests()
            for output in self.outputs:      # before the hold: no target of the old time line
                output.forget()
            self.stats.record_clock_jump()
            self.log_reason(f'{jump.describe()}: frame order forgotten, {num_dropped} engine '
                            f'requests and {num_queued} queued frames dropped', 'warning')
            self.forget_commands(f'{cmd.REASON_RESET}: {jump.describe()}')

    def _on_instruction_msg(self, msg: String) -> None:
        if msg.data != self.settings.instruction:   # both subscriptions may deliver it
            self._on_instruction(self, msg.data)

    def on_enable(self, flag: bool) -> tuple[bool, str]:
        """`~/enable`'s answer (success, message), its service being this channel's or the
        node's own."""
        return self._on_enable(self, bool(flag))

    def _on_enable_srv(self, request, response):
        response.success, response.message = self.on_enable(request.data)
        return response

    def _on_reset_srv(self, request, response):
        with self._paused():
            self.observation.clear()
            num_dropped, num_queued = self._drop_requests()
            was_running = self.forget_commands(f'{cmd.REASON_RESET}: ~/reset called')
        response.success = True
        response.message = (f'dropped {num_dropped} engine requests, {num_queued} queued '
                            f'frames and {int(was_running)} running chunks')
        self.node.get_logger().info(f'{self.label}: {response.message}')
        return response

    def _drop_requests(self) -> tuple[int, int]:
        """(The worker paused.) This robot's engine requests and queued frame dropped:
        (requests dropped, queued frames dropped)."""
        return self._on_reset(self), self.slot.clear()

    def forget_commands(self, reason: str) -> bool:
        """What the robot was executing was dropped (``~/reset``, a clock jump, a new
        instruction): its chunks go and, while it is enabled and active (otherwise it already
        holds), it holds now, so the last command sent (a moving step, a twist) does not
        stand until the next action. Whether a chunk was running. Call it with the worker
        paused (``self._paused()``): a result the worker is publishing would otherwise go out
        after the hold."""
        was_running = self.clear_chunks()
        if self.is_active and self.settings.enabled:
            self.reject(reason)
        return was_running

    def instruction_changed(self) -> None:
        """The robot's instruction changed or was cleared (executor thread, after the new
        settings are in force): nothing decided under the old one is acted on any more. The
        worker finishes its turn first (paused); the robot's frames in the engine are dropped
        (counted) with its kept reasoning (``reasoning_every_n``: a text reasoned before the
        change, reused after an A -> B -> A switch, would steer the robot; a frame of A still
        in flight would be published again); the chunk being executed is dropped (its steps
        stop at once: ChunkExecution checks the instruction) and the robot holds until the
        new instruction's first action (a cleared one holds: no instruction). The queued
        camera frame stays: it is submitted with the new instruction."""
        with self._paused():
            self.stats.record_dropped(self._on_reset(self))
            self.forget_commands(cmd.instruction_change_reason(self.settings.instruction))

    # ---- time -----------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def age_of(self, info: FrameInfo) -> float:
        return cmd.observation_age(self.now_s(), info.stamp_s, info.receipt_s, self.settings)

    def age_limit(self, settings) -> float | None:
        """The oldest image worth acting on: None (max_action_age) for a single-step model;
        for a chunked one, max_action_age + (K - 1) control periods (its last step may still
        be due, chunk_rules.py)."""
        return chunk_age_limit(self.chunk_steps, settings) if self.is_chunked else None

    def control_step(self, info: FrameInfo, settings) -> int | None:
        """The control step the image was taken at, for a chunked model's temporal drafting
        (Frame.control_step): its header stamp, else its receipt time, counted in
        control_period from the robot's previous image (control_steps.py); None for a
        single-step model. (Worker thread.)"""
        if not self.is_chunked:
            return None
        time_s = info.stamp_s if info.stamp_s > 0.0 else info.receipt_s
        return self._control_steps.step_at(time_s, settings.control_period)

    # ---- holds (safety_gate.py's verbs) ---------------------------------------------------

    def watchdog(self) -> None:
        """Hold state when disabled, without a fresh image or without an instruction. First
        the node clock is read for a jump back (observation_input.check_clock), so a robot
        whose camera paused over a simulator reset is reset too."""
        self.observation.check_clock()
        settings, newest = self.settings, self.newest
        clock_reason = self.clock_watch.reason(settings.max_action_age)
        if clock_reason is not None:
            self.hold_state(clock_reason)
            return
        age = None if newest is None else self.age_of(newest)
        reason = cmd.hold_reason_now(settings.enabled, age, settings,
                                     max_age_s=self.age_limit(settings))
        if reason is not None and settings.enabled:         # name a stalled image slot
            reason = self.observation.stale_slot_reason(
                self.age_of, self.age_limit(settings), settings) or reason
        if reason is not None:          # a camera that streams, its images out of order
            reason = self.observation.out_of_order_note(reason, newest, settings)
        if reason is None and not cmd.has_instruction(settings.instruction):
            reason = cmd.REASON_NO_INSTRUCTION
        if reason is None:
            reason = self._standing_reason(settings)
        if reason is not None:
            self.hold_state(reason)

    def _standing_reason(self, settings) -> str | None:
        """Why a single-step model's last command may not stand any longer, or None: its
        image is older than max_action_age and no newer action came (the camera is fresh but
        the engine is late or stalled, e.g. decoding a huge image), so the robot would keep
        acting on an old image. A chunked model's steps are aged one by one when due."""
        standing = self._standing
        if standing is None or self.is_chunked:
            return None
        reason = cmd.freshness_reason(self.age_of(standing), settings)
        if reason is None or cmd.reason_kind(reason) != cmd.REASON_STALE:
            return None
        return f'{reason} (the image of the command still standing; no newer action came)'

    def hold_state(self, reason: str) -> None:
        """A standing state says "do not move": the outputs' hold, `num_halt_messages`
        times on entering it, then quiet (so the node does not fight other sources); its
        reason is the robot's in /diagnostics either way."""
        if not self.is_active:
            return
        if self.gate.hold_state(reason, self.settings.num_halt_messages):
            self._send_hold(reason)
        else:
            self.stats.set_hold_reason(reason)

    def send_hold(self, reason: str) -> None:
        """The outputs' hold now, whatever was sent before (deactivation)."""
        if self.is_active and self.gate.hold_now(reason):
            self._send_hold(reason)

    def log_reason(self, reason: str, level: str) -> None:
        """`<robot>: <reason>` at `level` ('error', 'warning' or 'info'), unless this robot
        logged the same reason less than hold_log.THROTTLE_S ago (hold_log.py)."""
        line = self.hold_log.admit(reason)
        if line is None:
            return
        # One call per level: rclpy refuses two severities from one line of code.
        log, text = self.node.get_logger(), f'{self.label}: {line}'
        if level == 'error':
            log.error(text)
        elif level == 'warning':
            log.warning(text)
        else:
            log.info(text)

    def reject(self, reason: str, *, is_stale: bool = False, keep_chunk: bool = False) -> None:
        """A result, chunk step or frame that may not be acted on: counted as a hold, the
        outputs' hold sent now. A chunked model's chunks are dropped, unless `keep_chunk` (one
        step refused: the next may be fine)."""
        if not keep_chunk:
            self.clear_chunks()
        self.stats.record_hold(reason, is_stale_result=is_stale)
        self.send_hold(reason)

    def refuse(self, info: FrameInfo, reason: str) -> None:
        """A frame of this robot that will not be answered (bad input): rejected with
        ``reason``, and no command after it for an older image. The results of frames received
        before it, still in the engine, are dropped when they finish (``handle_finished``), so
        the robot keeps the hold until a newer frame's action. (Worker thread.)"""
        self.gate.refuse(info.receipt_mono)
        self.reject(reason)

    def _send_hold(self, reason: str) -> None:
        settings = self.settings
        self._standing = None
        self.stats.set_hold_reason(reason)
        now = self.node.get_clock().now().to_msg()
        for output in self.outputs:
            output.hold(now, settings)
        if self.servo is not None:
            self.servo.on_hold()
        kind = cmd.reason_kind(reason)
        if kind in cmd.FAILURE_REASONS:
            level = 'error'
        elif kind in (cmd.REASON_DISABLED, cmd.REASON_NO_INSTRUCTION,   # expected states
                      cmd.REASON_NEW_INSTRUCTION, cmd.REASON_RESET):
            level = 'info'
        else:
            level = 'warning'
        self.log_reason(f'hold: {reason}', level)

    def _is_superseded(self, finished) -> bool:
        """Whether something newer decided against a finished frame's result (safety_gate
        superseded_reason); such a result is dropped, counted and logged."""
        info: FrameInfo = finished.frame.user_data
        why = self.gate.superseded_reason(info.receipt_mono, finished.frame.instruction,
                                          self.settings.instruction)
        if why is None:
            return False
        self.stats.record_dropped(1)
        self.log_reason(f'result not published: {why}', 'info')
        return True

    def reject_result(self, reason: str) -> None:
        self.reject(reason, is_stale=cmd.is_stale_reason(reason))

    # ---- results (worker thread) ----------------------------------------------------------

    def handle_finished(self, finished) -> None:
        """The safety decision (S7) for one finished frame of this robot, then publish. A frame
        received before a refused one, or submitted under another instruction, is dropped
        instead (``_is_superseded``)."""
        if self._is_superseded(finished):
            return
        clock_reason = self.clock_watch.reason(self.settings.max_action_age)
        if clock_reason is not None:        # no age can be trusted: nothing is acted on
            self.reject(clock_reason)
            return
        if self.reasoning_output is not None:       # what it thought, acted on or not
            self.reasoning_output.publish_reasoning(
                finished.result, cmd.command_stamp(finished.frame.user_data, self.settings))
        if self.is_chunked:
            self.chunk_execution.handle_finished(finished)
            return
        info: FrameInfo = finished.frame.user_data
        settings = self.settings
        command = cmd.decide_command(finished.result, error=finished.error,
                                     is_enabled=settings.enabled and self.is_active,
                                     age_s=self.age_of(info), settings=settings,
                                     action_dim=self.action_dim)
        if command.is_hold:
            self.reject_result(command.hold_reason)
            return
        prepared = self.prepare(info, settings)
        if prepared is None:
            return
        if self.publish_command(command, cmd.command_stamp(info, settings), prepared):
            # After the publish: a hold that went out just before it no longer stands, the
            # command does (one just after it finds this set and, when the image is old,
            # holds once more: a zero too many, never one too few).
            self._standing = info
            # Counted as an action only when it went out (not while MoveIt Servo would drop
            # it: the robot held instead, and /diagnostics says why).
            record_answer(self.stats, info, finished.result.stats, self.age_of(info))

    def prepare(self, info: FrameInfo, settings) -> list | None:
        """Each output's `prepare` for this observation, or None after rejecting it because
        one output cannot be computed (output_adapter.py)."""
        observation_s = cmd.aged_from(info.stamp_s, info.receipt_s, settings)  # as inputs
        prepared = []
        for output in self.outputs:
            value, why = output.prepare(observation_s, settings)
            if why is not None:
                self.reject(why)
                return None
            prepared.append(value)
        return prepared

    def replace_settings(self, settings):
        """New settings in force (executor thread, Serving.apply); returns the old ones. Not
        in the middle of a chunk step: one decided under the old settings goes out first, and
        every later step sees the new ones (a new instruction stops the chunk there)."""
        with self.chunk_execution.between_steps():
            before, self.settings = self.settings, settings
        return before

    def clear_chunks(self) -> bool:
        """Forget the chunks being executed (disable, deactivate, reset, a failure); whether
        one still had steps to run."""
        return self.chunk_execution.clear()

    def publish_due_step(self, now_s: float | None = None) -> float | None:
        """Publish the step due at `now_s` (node clock; default now), if any and not yet
        decided; returns when the next one is due (node clock seconds) or None."""
        if not self.is_chunked:
            return None
        return self.chunk_execution.publish_due(self.now_s() if now_s is None else now_s)

    def release(self) -> bool:
        """Before a command goes out: leave the hold state (safety_gate.released) and resume
        Servo; False while inactive (nothing is published) or while MoveIt Servo would drop
        the command (servo_contract.hold_reason): the robot holds instead."""
        if not self.is_active:
            return False
        waiting = self.servo.hold_reason() if self.servo is not None else None
        if waiting is not None:
            self.reject(waiting, keep_chunk=True)
            return False
        self.gate.released()
        if self.servo is not None:
            self.servo.on_command()
        return True

    def publish_command(self, command: cmd.Command, stamp, prepared=None) -> bool:
        """A decided command to every output (`prepared`: their `prepare` values); whether it
        went out (not while inactive or while Servo would drop it: release)."""
        if not self.release():
            return False
        prepared = prepared or [None] * len(self.outputs)
        for output, value in zip(self.outputs, prepared):
            output.publish_command(command, stamp, self.settings, value)
        return True

    def publish_chunk(self, chunk, commands, settings, prepared) -> None:
        """A chunk kept by chunk_execution to every output, whole (nothing while inactive)."""
        if not self.is_active:
            return
        for output, value in zip(self.outputs, prepared):
            output.publish_chunk(chunk, commands, settings, value)

    def publish_step(self, chunk, index: int, command: cmd.Command, stamp, settings) -> bool:
        """A chunk's due step to every output, unless the robot holds instead (release);
        whether it went out."""
        if not self.release():
            return False
        for output in self.outputs:
            output.publish_step(chunk, index, command, stamp, settings)
        return True

    # ---- diagnostics and teardown ---------------------------------------------------------

    def diagnostic(self, mode: str):
        name = f'{self.node.get_fully_qualified_name()}: inference'
        if self.name:
            name += f' ({self.name})'
        extras = (list(self.observation.inputs) + list(self.outputs)
                  + ([self.servo] if self.servo is not None else []))
        is_acting = self.settings.enabled and self.is_active
        status = robot_status(self.stats, name=name, hardware_id=self.settings.model_path,
                              mode=mode, is_enabled=self.settings.enabled,
                              is_acting=is_acting, extras=extras)
        add_listener_status(status, [p for output in self.outputs
                                     for p in output.command_publishers()],
                            is_enabled=is_acting)
        return status

    def destroy(self) -> None:
        """Remove this channel's ROS entities (lifecycle cleanup)."""
        node = self.node
        for output in self.outputs + ([self.servo] if self.servo is not None else []):
            output.destroy()
        self.observation.destroy()
        for sub in self._instruction_subs:
            node.destroy_subscription(sub)
        for srv in self._services:
            node.destroy_service(srv)


__all__ = ['RobotChannel', 'FrameInfo', 'LatestFrameSlot']
