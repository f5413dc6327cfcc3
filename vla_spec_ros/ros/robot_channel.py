"""One robot's side of the node: its topics, services, settings, safety state and publishing.

A node serves one robot (today's `~/image`, `~/twist`, ... names) or several (`robots`
parameter: `<name>/image`, `<name>/twist`, ... one RobotChannel each) from one engine. A channel
owns everything that is per robot:

  inputs   image (raw or compressed; depth-1 slot, latest wins), instruction
  outputs  twist (stamped with the image's stamp), gripper, action, GripperCommand goals
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

from vla_spec_ros.ros import command as cmd
from vla_spec_ros.ros.diagnostics import InferenceStats, diagnostic_status, frame_stages
from vla_spec_ros.ros.qos import (COMMAND_QOS, IMAGE_QOS, INSTRUCTION_QOS,
                                  INSTRUCTION_VOLATILE_QOS)

try:  # not on PyPI; used where a ROS distribution provides it
    from control_msgs.action import GripperCommand
    from rclpy.action import ActionClient
except ImportError:
    GripperCommand = None

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
    """

    def __init__(self, node, name: str, settings, *, wakeup: threading.Event,
                 on_instruction, on_enable, on_reset):
        self.node = node
        self.name = name
        self.stream_id = name or 'default'
        self.settings = settings
        self.is_active = True
        self.stats = InferenceStats()
        self.slot = LatestFrameSlot(wakeup)
        self.newest: FrameInfo | None = None
        self._halt_lock = threading.Lock()
        self._halt_kind: str | None = None
        self._num_halts_sent = 0
        self._last_gripper_goal: float | None = None
        self._on_instruction, self._on_enable, self._on_reset = on_instruction, on_enable, on_reset

        prefix = f'{name}/' if name else '~/'
        self.twist_pub = node.create_publisher(TwistStamped, prefix + 'twist', COMMAND_QOS)
        self.gripper_pub = node.create_publisher(Float64MultiArray, prefix + 'gripper',
                                                 COMMAND_QOS)
        self.action_pub = node.create_publisher(Float64MultiArray, prefix + 'action',
                                                COMMAND_QOS)
        self._gripper_client = self._make_gripper_client()
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

    def watchdog(self) -> None:
        """Zero twist when disabled, without a fresh image or without an instruction."""
        settings, newest = self.settings, self.newest
        age = None if newest is None else self.age_of(newest)
        reason = cmd.hold_reason_now(settings.enabled, age, settings)
        if reason is None and not settings.instruction:
            reason = cmd.REASON_NO_INSTRUCTION
        if reason is not None:
            self.publish_zero(reason, force=False)

    def hold(self, reason: str, *, force: bool, is_stale_result: bool = False) -> None:
        """Record a hold and publish a zero twist (see publish_zero)."""
        self.stats.record_hold(reason, is_stale_result=is_stale_result)
        self.publish_zero(reason, force=force)

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
        self.twist_pub.publish(twist_message(cmd.ZERO3, cmd.ZERO3,
                                             self.node.get_clock().now().to_msg(),
                                             settings.frame_id))
        log, text = self.node.get_logger(), f'{self.label}: zero twist: {reason}'
        if kind in cmd.FAILURE_REASONS:
            log.error(text, throttle_duration_sec=LOG_THROTTLE_S)
        elif kind in (cmd.REASON_DISABLED, cmd.REASON_NO_INSTRUCTION):   # expected states
            log.info(text, throttle_duration_sec=LOG_THROTTLE_S)
        else:
            log.warning(text, throttle_duration_sec=LOG_THROTTLE_S)

    # ---- results (worker thread) ----------------------------------------------------------

    def handle_finished(self, finished) -> None:
        """The safety decision (S7) for one finished frame of this robot, then publish."""
        info: FrameInfo = finished.frame.user_data
        settings = self.settings
        command = cmd.decide_command(finished.result, error=finished.error,
                                     is_enabled=settings.enabled and self.is_active,
                                     age_s=self.age_of(info), settings=settings)
        if command.is_hold:
            kind = cmd.reason_kind(command.hold_reason)
            self.hold(command.hold_reason, force=True,
                      is_stale_result=kind in (cmd.REASON_STALE, cmd.REASON_FUTURE))
            return
        self.publish_command(command, info.stamp)
        stats = finished.result.stats
        now = time.monotonic()
        stages = None if math.isnan(info.converted_mono) else frame_stages(
            info.receipt_mono, info.taken_mono, info.converted_mono,
            stats.get('latency_s', 0.0), stats.get('compute_s', 0.0), now)
        self.stats.record_action(now, now - info.receipt_mono,
                                 stats.get('accepted_lengths', ()), stages,
                                 age_s=self.age_of(info))

    def publish_command(self, command: cmd.Command, stamp) -> None:
        if not self.is_active:
            return
        settings = self.settings
        with self._halt_lock:
            self._halt_kind = None
        self.twist_pub.publish(twist_message(command.linear, command.angular, stamp,
                                             settings.frame_id))
        self.gripper_pub.publish(Float64MultiArray(data=[command.gripper]))
        self.action_pub.publish(Float64MultiArray(data=list(command.action)))
        self._send_gripper_goal(command.gripper, settings)

    def diagnostic(self, mode: str):
        snapshot = self.stats.snapshot(time.monotonic())
        name = f'{self.node.get_fully_qualified_name()}: inference'
        if self.name:
            name += f' ({self.name})'
        return diagnostic_status(snapshot, name=name, hardware_id=self.settings.model_path,
                                 mode=mode, is_enabled=self.settings.enabled and self.is_active)

    # ---- gripper action -------------------------------------------------------------------

    def _make_gripper_client(self):
        name = self.settings.gripper_action_name
        if not name:
            return None
        if GripperCommand is None:
            self.node.get_logger().warning(
                f'{self.label}: gripper_action_name {name!r} set but control_msgs is not '
                'importable; only the gripper topic is published')
            return None
        return ActionClient(self.node, GripperCommand, name)

    def _send_gripper_goal(self, position: float, settings) -> None:
        client = self._gripper_client
        if client is None or position == self._last_gripper_goal:
            return
        if not client.server_is_ready():
            self.node.get_logger().warning(f'{self.label}: GripperCommand server not ready',
                                           throttle_duration_sec=LOG_THROTTLE_S)
            return
        goal = GripperCommand.Goal()
        goal.command.position = float(position)
        goal.command.max_effort = float(settings.gripper_max_effort)
        client.send_goal_async(goal)
        self._last_gripper_goal = position

    def destroy(self) -> None:
        """Remove this channel's ROS entities (lifecycle cleanup)."""
        node = self.node
        for pub in (self.twist_pub, self.gripper_pub, self.action_pub):
            node.destroy_publisher(pub)
        for sub in [self._image_sub] + self._instruction_subs:
            node.destroy_subscription(sub)
        for srv in self._services:
            node.destroy_service(srv)
        if self._gripper_client is not None:
            self._gripper_client.destroy()


def twist_message(linear, angular, stamp, frame_id: str) -> TwistStamped:
    msg = TwistStamped()
    msg.header.stamp = stamp
    msg.header.frame_id = frame_id
    msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = linear
    msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = angular
    return msg


__all__ = ['FrameInfo', 'LatestFrameSlot', 'RobotChannel', 'twist_message']
