"""One robot's side of the node: its topics, services, settings, safety state and publishing.

A node serves one robot (today's `~/image`, `~/twist`, ... names) or several (`robots`
parameter: `<name>/image`, `<name>/twist`, ... one RobotChannel each) from one engine. A channel
owns everything that is per robot:

  inputs   image (raw or compressed; depth-1 slot, latest wins), instruction
  outputs  twist (stamped with the image's stamp), gripper, action, gripper action goals
           (gripper_action.py); with a chunked model, one step per control period
           (chunk_schedule.py) and each chunk's velocities as a MultiDOFJointTrajectory on
           velocity_trajectory (and its former name, trajectory); with pose_targets, absolute
           tool targets (pose_targets.py); with servo_node, MoveIt Servo's contract
           (servo_contract.py)
  services enable (SetBool), reset (Trigger: drops this robot's engine requests only)
  safety   staleness check, zero-twist holds with their reason, halt-message budget
  stats    rate, latency, acceptance, drops, answered fraction, oldest action published
           (one /diagnostics status per robot)

Its settings are a NodeSettings built from the node's parameters overlaid with the robot's own
(`<name>.frame_id`, ...; params.robot_settings). The node swaps them in on `ros2 param set`.
Publishing is gated by `is_active` (a lifecycle node keeps it False until activated).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass

from geometry_msgs.msg import TwistStamped
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from vla_spec_ros.ros import chunk_schedule as chunks
from vla_spec_ros.ros import command as cmd
from vla_spec_ros.ros.diagnostics import InferenceStats, diagnostic_status, frame_stages
from vla_spec_ros.ros.gripper_action import GripperActionOutput
from vla_spec_ros.ros.pose_targets import PoseTargetOutput
from vla_spec_ros.ros.qos import (COMMAND_QOS, IMAGE_QOS, INSTRUCTION_QOS,
                                  INSTRUCTION_VOLATILE_QOS)

try:  # ros-kilted-trajectory-msgs on PyPI; a chunked model's ~/trajectory needs it
    from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint
except ImportError:
    MultiDOFJointTrajectory = MultiDOFJointTrajectoryPoint = None

LOG_THROTTLE_S = 2.0


@dataclass(frozen=True)
class FrameInfo:
    """What the node remembers about one image; travels as Frame.user_data."""

    stamp: object           # builtin_interfaces/Time of the image header (node clock if zero)
    stamp_s: float          # header stamp in seconds, 0.0 when the driver did not stamp
    receipt_s: float        # node clock at receipt
    receipt_mono: float     # time.monotonic() at receipt, for latency
    # time.monotonic() when the worker took the frame and when it had converted it (NaN until
    # then): where the frame's time went (diagnostics.FRAME_STAGES)
    taken_mono: float = float('nan')
    converted_mono: float = float('nan')


class LatestFrameSlot:
    """A queue of depth 1: `put` replaces an item the worker has not taken yet.

    `wakeup` (optional, shared by every robot's slot) is set on each put, so one worker can
    wait for the first frame of any robot."""

    def __init__(self, wakeup: threading.Event | None = None):
        self._cond = threading.Condition()
        self._item = None
        self._wakeup = wakeup

    def put(self, item) -> bool:
        """Store `item`; True when it replaced (dropped) an untaken one."""
        with self._cond:
            replaced = self._item is not None
            self._item = item
            self._cond.notify()
        if self._wakeup is not None:
            self._wakeup.set()
        return replaced

    def take(self, timeout: float = 0.0):
        """The item, or None after `timeout` seconds (0 = do not wait)."""
        with self._cond:
            if self._item is None and timeout > 0:
                self._cond.wait(timeout)
            item, self._item = self._item, None
        return item

    def clear(self) -> int:
        with self._cond:
            had = self._item is not None
            self._item = None
        return int(had)


class RobotChannel:
    """The interfaces and state of one robot (see the module docstring).

    `name`: '' for the single-robot node (private topics `~/image`, ...), else the robot's name
    (topics `<name>/image`, ...). `stream_id` is the engine stream of its frames.
    `on_instruction(channel, text)` and `on_enable(channel, flag) -> (ok, message)` route the
    topic and service to the node, which owns the parameters; `on_reset(channel) -> int`
    drops this robot's engine requests.

    `chunk_steps`: the model's action_chunk K. With K > 1 a finished frame's chunk is kept in
    `schedule` and its steps are published by `publish_due_step`, which the node's step clock
    calls at every slot start (`on_chunk()` wakes it when a chunk arrives).
    """

    def __init__(self, node, name: str, settings, *, wakeup: threading.Event,
                 on_instruction, on_enable, on_reset, chunk_steps: int = 1, on_chunk=None):
        self.node = node
        self.name = name
        self.stream_id = name or 'default'
        self.settings = settings
        self.servo = None                         # ServoContract, with servo_node set
        self.is_active = True
        self.stats = InferenceStats()
        self.slot = LatestFrameSlot(wakeup)
        self.newest: FrameInfo | None = None
        self._halt_lock = threading.Lock()
        self._halt_kind: str | None = None
        self._num_halts_sent = 0
        self._on_instruction, self._on_enable, self._on_reset = on_instruction, on_enable, on_reset
        self.chunk_steps = int(chunk_steps)
        self.schedule = chunks.ChunkSchedule()
        self._chunk_lock = threading.RLock()      # schedule + the steps' publishing order
        self._on_chunk = on_chunk
        self._trajectory_live = False             # a trajectory was sent and not stopped yet
        # Receipt time (time.monotonic) of this robot's newest frame refused as bad input
        # (worker thread only): a result for a frame received before it is not acted on.
        self._refused_receipt_mono = -math.inf

        prefix = f'{name}/' if name else '~/'
        self.twist_pub = node.create_publisher(TwistStamped, prefix + 'twist', COMMAND_QOS)
        self.gripper_pub = node.create_publisher(Float64MultiArray, prefix + 'gripper',
                                                 COMMAND_QOS)
        self.action_pub = node.create_publisher(Float64MultiArray, prefix + 'action',
                                                COMMAND_QOS)
        # A chunk's velocities; `trajectory` is the topic's former name, kept as an alias.
        self.trajectory_pub = self.legacy_trajectory_pub = None
        if self.is_chunked and MultiDOFJointTrajectory is not None:
            self.trajectory_pub = node.create_publisher(
                MultiDOFJointTrajectory, prefix + 'velocity_trajectory', COMMAND_QOS)
            self.legacy_trajectory_pub = node.create_publisher(
                MultiDOFJointTrajectory, prefix + 'trajectory', COMMAND_QOS)
        self._gripper = (GripperActionOutput(node, settings.gripper_action_name,
                                             settings.gripper_action_type, self.label)
                         if settings.gripper_action_name else None)
        self.pose_output = (PoseTargetOutput(node, prefix, settings, self.label,
                                             is_chunked=self.is_chunked)
                            if settings.pose_targets else None)
        if settings.servo_node:
            from vla_spec_ros.ros.servo_contract import ServoContract

            self.servo = ServoContract(node, settings.servo_node, settings.servo_command_type,
                                       self.label, pause_on_hold=settings.servo_pause_on_hold,
                                       measure=self._servo_measure)
            # Inactive until the owner sets is_active (the plain node at once, the managed
            # node on activate): a configured node leaves Servo alone.
        if settings.image_transport == 'compressed':
            self._image_sub = node.create_subscription(
                CompressedImage, prefix + 'image/compressed', self._on_image, IMAGE_QOS)
        else:
            self._image_sub = node.create_subscription(Image, prefix + 'image', self._on_image,
                                                       IMAGE_QOS)
        self._instruction_subs = [
            node.create_subscription(String, prefix + 'instruction', self._on_instruction_msg,
                                     qos) for qos in (INSTRUCTION_QOS, INSTRUCTION_VOLATILE_QOS)]
        self._services = [node.create_service(SetBool, prefix + 'enable', self._on_enable_srv),
                          node.create_service(Trigger, prefix + 'reset', self._on_reset_srv)]

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

    def _servo_measure(self):
        """(frame -> command latency p99 in s or None, control_period) for the Servo check."""
        latency_ms = self.stats.snapshot(time.monotonic()).get('latency_p99_ms', math.nan)
        return (None if math.isnan(latency_ms) else latency_ms * 1e-3,
                self.settings.control_period)

    @property
    def is_chunked(self) -> bool:
        return self.chunk_steps > 1

    # ---- callbacks (executor thread) ------------------------------------------------------

    def _on_image(self, msg) -> None:
        now = self.node.get_clock().now()
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        stamp = msg.header.stamp if stamp_s > 0.0 else now.to_msg()
        info = FrameInfo(stamp, stamp_s, now.nanoseconds * 1e-9, time.monotonic())
        self.stats.record_received()
        self.newest = info
        if self.is_active and self.settings.enabled and self.slot.put((msg, info)):
            self.stats.record_dropped()

    def _on_instruction_msg(self, msg: String) -> None:
        if msg.data != self.settings.instruction:   # both subscriptions may deliver it
            self._on_instruction(self, msg.data)

    def _on_enable_srv(self, request, response):
        response.success, response.message = self._on_enable(self, bool(request.data))
        return response

    def _on_reset_srv(self, request, response):
        num_dropped = self._on_reset(self)
        num_queued = self.slot.clear()
        self.clear_chunks()
        response.success = True
        response.message = (f'dropped {num_dropped} engine requests and {num_queued} '
                            'queued frames')
        self.node.get_logger().info(f'{self.label}: {response.message}')
        return response

    # ---- safety ---------------------------------------------------------------------------

    def now_s(self) -> float:
        return self.node.get_clock().now().nanoseconds * 1e-9

    def age_of(self, info: FrameInfo) -> float:
        return cmd.observation_age(self.now_s(), info.stamp_s, info.receipt_s, self.settings)

    def age_limit(self, settings) -> float | None:
        """The oldest image worth acting on: None (max_action_age) for a single-step model;
        for a chunked one, max_action_age + (K - 1) control periods (its last step may still
        be due, chunk_schedule.py)."""
        return chunks.chunk_age_limit(self.chunk_steps, settings) if self.is_chunked else None

    def control_step(self, info: FrameInfo, settings) -> int | None:
        """The control step the image was taken at, for a chunked model's temporal drafting
        (Frame.control_step): its header stamp, else its receipt time, over control_period;
        None for a single-step model."""
        if not self.is_chunked:
            return None
        time_s = info.stamp_s if info.stamp_s > 0.0 else info.receipt_s
        return round(time_s / settings.control_period)

    def watchdog(self) -> None:
        """Zero twist when disabled, without a fresh image or without an instruction."""
        settings, newest = self.settings, self.newest
        age = None if newest is None else self.age_of(newest)
        reason = cmd.hold_reason_now(settings.enabled, age, settings,
                                     max_age_s=self.age_limit(settings))
        if reason is None and not settings.instruction:
            reason = cmd.REASON_NO_INSTRUCTION
        if reason is not None:
            self.publish_zero(reason, force=False)

    def hold(self, reason: str, *, force: bool, is_stale_result: bool = False,
             keep_chunk: bool = False) -> None:
        """Record a hold and publish a zero twist (see publish_zero). A chunked model's
        chunks are dropped, unless `keep_chunk` (one step refused: the next may be fine)."""
        if not keep_chunk:
            self.clear_chunks()
        self.stats.record_hold(reason, is_stale_result=is_stale_result)
        self.publish_zero(reason, force=force)

    def refuse(self, info: FrameInfo, reason: str) -> None:
        """A frame of this robot that will not be answered (bad input): a zero twist with
        ``reason``, and no command after it for an older image. The results of frames received
        before it, still in the engine, are dropped when they finish (``handle_finished``), so
        the robot keeps the zero until a newer frame's action. (Worker thread.)"""
        self._refused_receipt_mono = max(self._refused_receipt_mono, info.receipt_mono)
        self.hold(reason, force=True)

    def _is_superseded(self, finished) -> bool:
        """Whether a finished frame's result must not be acted on because something newer
        decided against it: a frame of this robot received after it was refused (``refuse``),
        or the robot's instruction changed (or was cleared) since it was submitted. Such a
        result is dropped, counted and logged."""
        info: FrameInfo = finished.frame.user_data
        if info.receipt_mono < self._refused_receipt_mono:
            why = 'its image is older than a frame refused since'
        elif finished.frame.instruction != self.settings.instruction:
            why = 'the instruction changed since its frame was submitted'
        else:
            return False
        self.stats.record_dropped(1)
        self.node.get_logger().info(f'{self.label}: result not published: {why}',
                                    throttle_duration_sec=LOG_THROTTLE_S)
        return True

    def clear_chunks(self) -> None:
        """Forget the chunks being executed (disable, deactivate, reset, a failure)."""
        with self._chunk_lock:
            self.schedule.clear()

    def publish_zero(self, reason: str, *, force: bool) -> None:
        """Zero twist, gripper held. States (disabled, stale camera, no instruction) publish
        `num_halt_messages` zeros on entry and then go quiet, so the node does not fight other
        command sources; a failed frame (`force`) always replaces its action by a zero."""
        if not self.is_active:
            return
        settings = self.settings
        kind = cmd.reason_kind(reason)
        with self._halt_lock:
            if kind != self._halt_kind:
                self._halt_kind, self._num_halts_sent = kind, 0
            if not force and self._num_halts_sent >= settings.num_halt_messages:
                return
            self._num_halts_sent += 1
        self.stats.set_hold_reason(reason)
        now = self.node.get_clock().now().to_msg()
        self.twist_pub.publish(twist_message(cmd.ZERO3, cmd.ZERO3, now, settings.frame_id))
        if self._trajectory_live and self.trajectory_pub is not None:
            # An empty trajectory tells a trajectory controller to stop (trajectory_msgs).
            self._trajectory_live = False
            self._publish_velocity_trajectory(trajectory_message((), now, settings.frame_id,
                                                                 0.0))
        if self.pose_output is not None:
            self.pose_output.stop(now, settings)
        if self.servo is not None:
            self.servo.on_hold()
        log, text = self.node.get_logger(), f'{self.label}: zero twist: {reason}'
        if kind in cmd.FAILURE_REASONS:
            log.error(text, throttle_duration_sec=LOG_THROTTLE_S)
        elif kind in (cmd.REASON_DISABLED, cmd.REASON_NO_INSTRUCTION):   # expected states
            log.info(text, throttle_duration_sec=LOG_THROTTLE_S)
        else:
            log.warning(text, throttle_duration_sec=LOG_THROTTLE_S)

    # ---- results (worker thread) ----------------------------------------------------------

    def handle_finished(self, finished) -> None:
        """The safety decision (S7) for one finished frame of this robot, then publish. A frame
        received before a refused one, or submitted under another instruction, is dropped
        instead (``_is_superseded``)."""
        if self._is_superseded(finished):
            return
        if self.is_chunked:
            self._handle_chunk(finished)
            return
        info: FrameInfo = finished.frame.user_data
        settings = self.settings
        command = cmd.decide_command(finished.result, error=finished.error,
                                     is_enabled=settings.enabled and self.is_active,
                                     age_s=self.age_of(info), settings=settings)
        if command.is_hold:
            self._hold_result(command.hold_reason)
            return
        start = self._start_pose(info, settings)
        if start is False:
            return
        self.publish_command(command, info.stamp)
        if start is not None:
            self.pose_output.publish_action(start, command, info.stamp, settings)
        self._record_answer(info, finished.result.stats)

    def _start_pose(self, info: FrameInfo, settings):
        """With pose targets: the tool pose at the image's time, or False after holding
        because it is unknown (pose_targets.py); None without pose targets."""
        if self.pose_output is None:
            return None
        start, why = self.pose_output.start_pose(
            cmd.observation_time(info.stamp_s, info.receipt_s, settings), settings)
        if start is None:
            self.hold(why, force=True)
            return False
        return start

    def _hold_result(self, reason: str) -> None:
        """Hold for a finished frame whose result may not be acted on (S7)."""
        kind = cmd.reason_kind(reason)
        self.hold(reason, force=True,
                  is_stale_result=kind in (cmd.REASON_STALE, cmd.REASON_FUTURE))

    def _record_answer(self, info: FrameInfo, stats: dict) -> None:
        """Statistics of a frame that was acted on: latency, acceptance, where its time went
        (frame_stages; a frame never converted has none), its image's age."""
        now = time.monotonic()
        stages = None if math.isnan(info.converted_mono) else frame_stages(
            info.receipt_mono, info.taken_mono, info.converted_mono,
            stats.get('latency_s', 0.0), stats.get('compute_s', 0.0), now)
        self.stats.record_action(now, now - info.receipt_mono,
                                 stats.get('accepted_lengths', ()), stages,
                                 age_s=self.age_of(info))

    def _handle_chunk(self, finished) -> None:
        """A chunked model's frame: check the whole chunk (chunk_schedule.decide_chunk), keep
        it, publish it as a trajectory and publish its step that is due now."""
        info: FrameInfo = finished.frame.user_data
        settings = self.settings
        with self._chunk_lock:
            now = self.now_s()
            decision = chunks.decide_chunk(
                finished.result, error=finished.error,
                is_enabled=settings.enabled and self.is_active,
                age_s=cmd.observation_age(now, info.stamp_s, info.receipt_s, settings),
                num_steps=self.chunk_steps, settings=settings)
            if decision.hold_reason is not None:
                self._hold_result(decision.hold_reason)
                return
            start = self._start_pose(info, settings)
            if start is False:
                return
            chunk = chunks.Chunk(decision.actions,
                                 cmd.observation_time(info.stamp_s, info.receipt_s, settings),
                                 settings.control_period, info.stamp)
            accepted, replaced = self.schedule.add(chunk, now)
            if not accepted:
                self.node.get_logger().warning(
                    f'{self.label}: chunk ignored: its image is not newer than the chunk '
                    'being executed (camera clock stepped back?)',
                    throttle_duration_sec=LOG_THROTTLE_S)
                return
            self._publish_trajectory(chunk, decision.commands, settings)
            if start is not None and self.is_active:
                self.pose_output.add_chunk(chunk, start, decision.commands, info.stamp, settings)
            self._publish_due(now, from_clock=False)
        self.stats.record_chunk(replaced=replaced)
        self._record_answer(info, finished.result.stats)
        if self._on_chunk is not None:
            self._on_chunk()

    def publish_due_step(self, now_s: float | None = None) -> float | None:
        """Publish the step due at `now_s` (node clock; default now), if any and not yet
        decided; returns when the next one is due (node clock seconds) or None."""
        if not self.is_chunked:
            return None
        with self._chunk_lock:
            return self._publish_due(self.now_s() if now_s is None else now_s, from_clock=True)

    def _publish_due(self, now_s: float, *, from_clock: bool) -> float | None:
        settings = self.settings
        if not (settings.enabled and self.is_active):
            self.schedule.clear()
            return None
        due = self.schedule.due(now_s, blend=settings.chunk_blend,
                                decay=settings.chunk_ensemble_decay,
                                max_age_s=settings.max_action_age)
        if isinstance(due, chunks.RunOut):
            self.stats.record_chunk_run_out(due.num_skipped)
            self.hold(f'{cmd.REASON_CHUNK_END}: the {due.chunk.num_steps} steps of the image '
                      f'at {due.chunk.start_s:.3f} s are done and no newer chunk arrived',
                      force=True)
        elif due is not None:
            command = cmd.decide_command(chunks.StepAction(due.action), error=None,
                                         is_enabled=True, age_s=due.age_s, settings=settings)
            if command.is_hold:
                self.stats.record_chunk_step(published=False, num_skipped=due.num_skipped)
                self.hold(command.hold_reason, force=True, keep_chunk=True)
            else:
                stamp = offset_stamp(due.chunk.stamp, due.index * due.chunk.period_s)
                self.publish_command(command, stamp)
                if self.pose_output is not None:
                    self.pose_output.publish_step(due.chunk, due.index, stamp)
                late = self.now_s() - due.chunk.slot_start(due.index) if from_clock else None
                self.stats.record_chunk_step(published=True, num_skipped=due.num_skipped,
                                             lateness_s=late)
        return self.schedule.next_wake_s()

    def _publish_trajectory(self, chunk, commands, settings) -> None:
        if self.trajectory_pub is None or not self.is_active:
            return
        self._publish_velocity_trajectory(trajectory_message(commands, chunk.stamp,
                                                             settings.frame_id, chunk.period_s))
        self._trajectory_live = True

    def _publish_velocity_trajectory(self, msg) -> None:
        self.trajectory_pub.publish(msg)
        self.legacy_trajectory_pub.publish(msg)

    def publish_command(self, command: cmd.Command, stamp) -> None:
        if not self.is_active:
            return
        settings = self.settings
        with self._halt_lock:
            self._halt_kind = None
        if self.servo is not None:
            self.servo.on_command()
        self.twist_pub.publish(twist_message(command.linear, command.angular, stamp,
                                             settings.frame_id))
        self.gripper_pub.publish(Float64MultiArray(data=[command.gripper]))
        self.action_pub.publish(Float64MultiArray(data=list(command.action)))
        if self._gripper is not None:
            self._gripper.send(command.gripper, settings)

    def diagnostic(self, mode: str):
        snapshot = self.stats.snapshot(time.monotonic())
        name = f'{self.node.get_fully_qualified_name()}: inference'
        if self.name:
            name += f' ({self.name})'
        status = diagnostic_status(snapshot, name=name, hardware_id=self.settings.model_path,
                                   mode=mode, is_enabled=self.settings.enabled and self.is_active)
        if self.servo is not None:
            self.servo.add_to_status(status)
        return status

    def destroy(self) -> None:
        """Remove this channel's ROS entities (lifecycle cleanup)."""
        node = self.node
        for pub in (self.twist_pub, self.gripper_pub, self.action_pub, self.trajectory_pub,
                    self.legacy_trajectory_pub):
            if pub is not None:
                node.destroy_publisher(pub)
        for output in (self.servo, self.pose_output, self._gripper):
            if output is not None:
                output.destroy()
        for sub in [self._image_sub] + self._instruction_subs:
            node.destroy_subscription(sub)
        for srv in self._services:
            node.destroy_service(srv)


def twist_message(linear, angular, stamp, frame_id: str) -> TwistStamped:
    msg = TwistStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = linear
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = angular
    return msg


def offset_stamp(stamp, seconds: float):
    """builtin_interfaces/Time `stamp` + `seconds` (>= 0), in whole nanoseconds."""
    total = stamp.sec * 1_000_000_000 + stamp.nanosec + round(seconds * 1e9)
    return type(stamp)(sec=total // 1_000_000_000, nanosec=total % 1_000_000_000)


def trajectory_message(commands, stamp, frame_id: str, period_s: float):
    """A chunk as trajectory_msgs/MultiDOFJointTrajectory: one joint named `frame_id`, one
    point per step with the step's (scaled, limited) twist as its velocity and
    time_from_start = i * period_s; no transforms (the node does not know the pose). No
    commands: the empty trajectory, which stops a trajectory controller."""
    from geometry_msgs.msg import Twist

    msg = MultiDOFJointTrajectory()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.joint_names = [frame_id]
    for i, command in enumerate(commands):
        twist = Twist()
        twist.linear.x, twist.linear.y, twist.linear.z = command.linear
        twist.angular.x, twist.angular.y, twist.angular.z = command.angular
        point = MultiDOFJointTrajectoryPoint(velocities=[twist])
        nanoseconds = round(i * period_s * 1e9)
        point.time_from_start.sec = nanoseconds // 1_000_000_000
        point.time_from_start.nanosec = nanoseconds % 1_000_000_000
        msg.points.append(point)
    return msg


__all__ = ['FrameInfo', 'LatestFrameSlot', 'RobotChannel', 'twist_message', 'offset_stamp',
           'trajectory_message']
