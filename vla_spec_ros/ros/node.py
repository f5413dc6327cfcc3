"""The `vla_spec` node: camera + instruction in, TwistStamped + gripper out (DESIGN.md §8).

A thin adapter over the engine's streaming interface (ros2/examples idioms, STYLE.md item 10):

  ~/image or ~/image/compressed --(callback: stamp, depth-1 slot, latest wins)--> worker thread
  worker: convert -> Engine.submit -> Engine.step while has_work() -> decide_command (S7)
          -> ~/twist (stamped with the image's stamp), ~/gripper, ~/action, GripperCommand goal
  watchdog timer: zero twist when disabled or when the newest image is older than
          max_action_age, so a stalled camera never leaves the last command standing
  diagnostics timer: /diagnostics (rate, latency p50/p99, acceptance length, drops, last error)

Inference never runs in a callback. Engine calls are serialised by one lock (the worker holds
it for a step; ~/reset and tunable changes take it between steps). Frames are queued with
depth 1: a frame not yet taken by the worker is replaced by a newer one and counted as dropped,
and `Engine.drop_waiting` drops frames the engine has not started yet.
"""
from __future__ import annotations

import sys
import threading
import time
from dataclasses import asdict, dataclass

import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TwistStamped
from rcl_interfaces.msg import SetParametersResult
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from rclpy.parameter import Parameter
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from vla_spec_ros.engine.result import Frame, describe_error
from vla_spec_ros.ros import command as cmd
from vla_spec_ros.ros import conversions, params
from vla_spec_ros.ros.diagnostics import InferenceStats, diagnostic_status
from vla_spec_ros.ros.qos import (COMMAND_QOS, IMAGE_QOS, INSTRUCTION_QOS,
                                  INSTRUCTION_VOLATILE_QOS)

try:  # not on PyPI; used where a ROS distribution provides it
    from control_msgs.action import GripperCommand
    from rclpy.action import ActionClient
except ImportError:
    GripperCommand = None

STREAM_ID = 'default'
LOG_THROTTLE_S = 2.0
WORKER_IDLE_WAIT_S = 0.05     # how long the idle worker blocks on the frame slot


@dataclass(frozen=True)
class FrameInfo:
    """What the node remembers about one image; travels as Frame.user_data."""

    stamp: object           # builtin_interfaces/Time of the image header (node clock if zero)
    stamp_s: float          # header stamp in seconds, 0.0 when the driver did not stamp
    receipt_s: float        # node clock at receipt
    receipt_mono: float     # time.monotonic() at receipt, for latency


class LatestFrameSlot:
    """A queue of depth 1: `put` replaces an item the worker has not taken yet."""

    def __init__(self):
        self._cond = threading.Condition()
        self._item = None

    def put(self, item) -> bool:
        """Store `item`; True when it replaced (dropped) an untaken one."""
        with self._cond:
            replaced = self._item is not None
            self._item = item
            self._cond.notify()
        return replaced

    def take(self, timeout: float):
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


def load_policy(settings: params.NodeSettings, engine_config):
    """VLAPolicy.from_pretrained(model_path, **EngineConfig fields); torch imports here."""
    from vla_spec_ros.policy import VLAPolicy

    return VLAPolicy.from_pretrained(settings.model_path, **asdict(engine_config))


class VLASpecNode(Node):
    """The ROS 2 adapter. `policy` may be passed in (tests, embedding); else it is loaded."""

    def __init__(self, policy=None, *, node_name: str = 'vla_spec', **node_kwargs):
        super().__init__(node_name, **node_kwargs)
        # 1. Parameters: declare, refuse unknown overrides, map onto the dataclasses. All of
        #    this happens before anything is subscribed (a bad file fails here, loudly).
        self._values = params.declare_parameters(self)
        self._refuse_unknown_overrides()
        engine_config, self._settings = params.settings_from_parameters(self._values)
        self._engine_config = engine_config

        # 2. Model.
        if policy is None:
            self.get_logger().info(f'loading {self._settings.model_path!r} '
                                   f'(mode {engine_config.mode}, device {engine_config.device})')
            policy = load_policy(self._settings, engine_config)
        else:
            self.get_logger().info('using the policy passed to the node; load-time engine '
                                   'parameters come from it')
        self._policy = policy
        self._engine = policy.engine
        self._unnorm_keys = tuple(policy.unnorm_keys)
        self._check_unnorm_key(self._settings.unnorm_key)
        self._engine_lock = threading.Lock()
        self._pending_tunables = params.tunable_engine_changes(self._engine.config,
                                                               engine_config)

        # 3. Runtime state.
        self._stats = InferenceStats()
        self._slot = LatestFrameSlot()
        self._newest: FrameInfo | None = None
        self._halt_lock = threading.Lock()
        self._halt_kind: str | None = None
        self._num_halts_sent = 0
        self._last_gripper_goal: float | None = None
        self._stop = threading.Event()

        # 4. Interfaces.
        self._twist_pub = self.create_publisher(TwistStamped, '~/twist', COMMAND_QOS)
        self._gripper_pub = self.create_publisher(Float64MultiArray, '~/gripper', COMMAND_QOS)
        self._action_pub = self.create_publisher(Float64MultiArray, '~/action', COMMAND_QOS)
        self._diag_pub = self.create_publisher(DiagnosticArray, '/diagnostics', COMMAND_QOS)
        self._gripper_client = self._make_gripper_client()
        if self._settings.image_transport == 'compressed':
            self.create_subscription(CompressedImage, '~/image/compressed', self._on_image,
                                     IMAGE_QOS)
        else:
            self.create_subscription(Image, '~/image', self._on_image, IMAGE_QOS)
        self.create_subscription(String, '~/instruction', self._on_instruction, INSTRUCTION_QOS)
        self.create_subscription(String, '~/instruction', self._on_instruction,
                                 INSTRUCTION_VOLATILE_QOS)
        self.create_service(SetBool, '~/enable', self._on_enable)
        self.create_service(Trigger, '~/reset', self._on_reset)
        self.add_on_set_parameters_callback(self._validate_parameters)
        self.add_post_set_parameters_callback(self._apply_parameters)
        self.create_timer(self._settings.watchdog_period, self._on_watchdog)
        self.create_timer(self._settings.diagnostics_period, self._publish_diagnostics)

        self._worker = threading.Thread(target=self._worker_loop, name='vla_spec_worker',
                                        daemon=True)
        self._worker.start()
        self.get_logger().info(
            f'ready: mode {self._engine.config.mode}, '
            f'{"enabled" if self._settings.enabled else "disabled (call ~/enable)"}, '
            f'image transport {self._settings.image_transport}')

    # ---- parameters -----------------------------------------------------------------------

    def _refuse_unknown_overrides(self) -> None:
        # rclpy silently ignores overrides for undeclared names; a misspelled key in the
        # params file must fail instead (STYLE.md item 3).
        overrides = getattr(self, '_parameter_overrides', {})
        unknown = sorted(name for name in overrides
                         if not self.has_parameter(name) and not name.startswith('qos_overrides.'))
        if unknown:
            raise ValueError(f'unknown parameters {unknown} for node {self.get_name()}; known: '
                             f'{sorted(params.PARAMETERS_BY_NAME)}')

    def _check_unnorm_key(self, key: str) -> None:
        if key and key not in self._unnorm_keys:
            raise ValueError(f'unnorm_key: {key!r} not in this checkpoint\'s '
                             f'{list(self._unnorm_keys)}')

    def _validate_parameters(self, changes) -> SetParametersResult:
        """On-set callback: refuse load-time changes and invalid values (no side effects)."""
        proposed = dict(self._values)
        for change in changes:
            if change.name not in params.PARAMETERS_BY_NAME:
                continue       # use_sim_time and other rclpy-owned parameters
            if (change.name in params.LOAD_TIME_PARAMETERS
                    and change.value != self._values[change.name]):
                return SetParametersResult(successful=False,
                                           reason=params.load_time_refusal(change.name))
            proposed[change.name] = change.value
        try:
            params.settings_from_parameters(proposed)
            self._check_unnorm_key(proposed['unnorm_key'])
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _apply_parameters(self, changes) -> None:
        """Post-set callback: new settings for the next frame; engine tunables are queued."""
        for change in changes:
            if change.name in params.PARAMETERS_BY_NAME:
                self._values[change.name] = change.value
        engine_config, settings = params.settings_from_parameters(self._values)
        with self._engine_lock:
            self._pending_tunables.update(
                params.tunable_engine_changes(self._engine_config, engine_config))
        self._engine_config = engine_config
        was_enabled, self._settings = self._settings.enabled, settings
        if was_enabled != settings.enabled:
            self.get_logger().info('enabled' if settings.enabled else 'disabled')
            if not settings.enabled:
                self._slot.clear()

    # ---- callbacks (executor thread) ------------------------------------------------------

    def _on_image(self, msg) -> None:
        now = self.get_clock().now()
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        stamp = msg.header.stamp if stamp_s > 0.0 else now.to_msg()
        info = FrameInfo(stamp, stamp_s, now.nanoseconds * 1e-9, time.monotonic())
        self._stats.record_received()
        self._newest = info
        if self._settings.enabled and self._slot.put((msg, info)):
            self._stats.record_dropped()

    def _on_instruction(self, msg: String) -> None:
        if msg.data == self._values['instruction']:
            return      # the transient-local and volatile subscriptions may both deliver it
        result = self.set_parameters([Parameter('instruction', value=msg.data)])[0]
        if not result.successful:
            self.get_logger().warning(f'instruction refused: {result.reason}')

    def _on_enable(self, request, response):
        result = self.set_parameters([Parameter('enabled', value=bool(request.data))])[0]
        response.success = result.successful
        response.message = (('enabled' if request.data else 'disabled') if result.successful
                            else result.reason)
        return response

    def _on_reset(self, request, response):
        with self._engine_lock:
            dropped = self._engine.reset()
        num_queued = self._slot.clear()
        response.success = True
        response.message = (f'dropped {len(dropped)} engine requests and {num_queued} '
                            'queued frames')
        self.get_logger().info(response.message)
        return response

    def _on_watchdog(self) -> None:
        settings, newest = self._settings, self._newest
        age = None
        if newest is not None:
            age = cmd.observation_age(self._now_s(), newest.stamp_s, newest.receipt_s, settings)
        reason = cmd.hold_reason_now(settings.enabled, age, settings)
        if reason is None and not settings.instruction:
            reason = cmd.REASON_NO_INSTRUCTION
        if reason is not None:
            self._publish_zero(reason, force=False)

    def _publish_diagnostics(self) -> None:
        snapshot = self._stats.snapshot(time.monotonic())
        array = DiagnosticArray()
        array.header.stamp = self.get_clock().now().to_msg()
        array.status = [diagnostic_status(
            snapshot, name=f'{self.get_fully_qualified_name()}: inference',
            hardware_id=self._settings.model_path, mode=self._engine.config.mode,
            is_enabled=self._settings.enabled)]
        self._diag_pub.publish(array)

    # ---- worker thread --------------------------------------------------------------------

    def _engine_has_work(self) -> bool:
        with self._engine_lock:
            return self._engine.has_work()

    def _worker_loop(self) -> None:
        while not self._stop.is_set():
            try:
                # Never block on the slot while requests are in flight: they must keep
                # stepping (S6), new frames join them between steps.
                item = self._slot.take(0.0 if self._engine_has_work() else WORKER_IDLE_WAIT_S)
                if item is not None:
                    self._submit(*item)
                if self._engine_has_work():
                    self._step()
            except Exception as exc:   # the engine broke its contract; hold and start over
                self._hold(f'{cmd.REASON_ENGINE_ERROR}: {describe_error(exc)}', force=True)
                try:
                    with self._engine_lock:
                        self._engine.reset()
                except Exception as reset_exc:
                    self._hold(f'{cmd.REASON_ENGINE_ERROR}: reset failed: '
                               f'{describe_error(reset_exc)}', force=True)
                    self._stop.wait(1.0)

    def _submit(self, msg, info: FrameInfo) -> None:
        settings = self._settings
        if not settings.enabled:
            return
        if not settings.instruction:
            self._hold(cmd.REASON_NO_INSTRUCTION, force=False)
            return
        age = cmd.observation_age(self._now_s(), info.stamp_s, info.receipt_s, settings)
        stale = cmd.freshness_reason(age, settings)
        if stale is not None:          # already too old: do not spend compute on it
            self._hold(stale, force=True, is_stale_result=True)
            return
        try:
            if isinstance(msg, CompressedImage):
                image = conversions.compressed_to_rgb(msg)
            else:
                image = conversions.image_to_rgb(msg)
        except ValueError as exc:
            self._hold(f'{cmd.REASON_BAD_INPUT}: image {exc}', force=True)
            return
        frame = Frame(image, settings.instruction, settings.unnorm_key_or_none, STREAM_ID,
                      user_data=info)
        with self._engine_lock:
            pending, self._pending_tunables = self._pending_tunables, {}
            if pending:          # validated by settings_from_parameters when they were set
                self._engine.set_tunables(**pending)
            dropped = self._engine.drop_waiting(STREAM_ID)
            try:
                self._engine.submit(frame)
            except ValueError as exc:
                self._hold(f'{cmd.REASON_BAD_INPUT}: {exc}', force=True)
                return
        self._stats.record_dropped(len(dropped))
        self._stats.record_submitted()

    def _step(self) -> None:
        with self._engine_lock:
            finished = self._engine.step()
        for item in finished:
            self._handle_finished(item)

    def _handle_finished(self, finished) -> None:
        info: FrameInfo = finished.frame.user_data
        settings = self._settings
        age = cmd.observation_age(self._now_s(), info.stamp_s, info.receipt_s, settings)
        command = cmd.decide_command(finished.result, error=finished.error,
                                     is_enabled=settings.enabled, age_s=age, settings=settings)
        if command.is_hold:
            kind = cmd.reason_kind(command.hold_reason)
            self._hold(command.hold_reason, force=True,
                       is_stale_result=kind in (cmd.REASON_STALE, cmd.REASON_FUTURE))
            return
        self._publish_command(command, info.stamp, settings)
        accepted = finished.result.stats.get('accepted_lengths', ())
        self._stats.record_action(time.monotonic(), time.monotonic() - info.receipt_mono,
                                  accepted)

    # ---- publishing -----------------------------------------------------------------------

    def _now_s(self) -> float:
        return self.get_clock().now().nanoseconds * 1e-9

    def _twist(self, linear, angular, stamp, frame_id: str) -> TwistStamped:
        msg = TwistStamped()
        msg.header.stamp = stamp
        msg.header.frame_id = frame_id
        msg.twist.linear.x, msg.twist.linear.y, msg.twist.linear.z = linear
        msg.twist.angular.x, msg.twist.angular.y, msg.twist.angular.z = angular
        return msg

    def _publish_command(self, command: cmd.Command, stamp, settings) -> None:
        with self._halt_lock:
            self._halt_kind = None
        self._twist_pub.publish(self._twist(command.linear, command.angular, stamp,
                                            settings.frame_id))
        self._gripper_pub.publish(Float64MultiArray(data=[command.gripper]))
        self._action_pub.publish(Float64MultiArray(data=list(command.action)))
        self._send_gripper_goal(command.gripper, settings)

    def _hold(self, reason: str, *, force: bool, is_stale_result: bool = False) -> None:
        """Record a hold and publish a zero twist (see _publish_zero)."""
        self._stats.record_hold(reason, is_stale_result=is_stale_result)
        self._publish_zero(reason, force=force)

    def _publish_zero(self, reason: str, *, force: bool) -> None:
        """Zero twist, gripper held. States (disabled, stale camera, no instruction) publish
        `num_halt_messages` zeros on entry and then go quiet, so the node does not fight other
        command sources; a failed frame (`force`) always replaces its action by a zero."""
        settings = self._settings
        kind = cmd.reason_kind(reason)
        with self._halt_lock:
            if kind != self._halt_kind:
                self._halt_kind, self._num_halts_sent = kind, 0
            if not force and self._num_halts_sent >= settings.num_halt_messages:
                return
            self._num_halts_sent += 1
        self._stats.set_hold_reason(reason)
        self._twist_pub.publish(self._twist(cmd.ZERO3, cmd.ZERO3,
                                            self.get_clock().now().to_msg(), settings.frame_id))
        log = self.get_logger()
        if kind in cmd.FAILURE_REASONS:
            log.error(f'zero twist: {reason}', throttle_duration_sec=LOG_THROTTLE_S)
        elif kind in (cmd.REASON_DISABLED, cmd.REASON_NO_INSTRUCTION):   # expected states
            log.info(f'zero twist: {reason}', throttle_duration_sec=LOG_THROTTLE_S)
        else:
            log.warning(f'zero twist: {reason}', throttle_duration_sec=LOG_THROTTLE_S)

    def _make_gripper_client(self):
        name = self._settings.gripper_action_name
        if not name:
            return None
        if GripperCommand is None:
            self.get_logger().warning(f'gripper_action_name {name!r} set but control_msgs is '
                                      'not importable; only ~/gripper is published')
            return None
        return ActionClient(self, GripperCommand, name)

    def _send_gripper_goal(self, position: float, settings) -> None:
        client = self._gripper_client
        if client is None or position == self._last_gripper_goal:
            return
        if not client.server_is_ready():
            self.get_logger().warning('GripperCommand server not ready',
                                      throttle_duration_sec=LOG_THROTTLE_S)
            return
        goal = GripperCommand.Goal()
        goal.command.position = float(position)
        goal.command.max_effort = float(settings.gripper_max_effort)
        client.send_goal_async(goal)
        self._last_gripper_goal = position

    # ---- lifecycle ------------------------------------------------------------------------

    def stats_snapshot(self) -> dict:
        return self._stats.snapshot(time.monotonic())

    def destroy_node(self):
        self._stop.set()
        if self._worker.is_alive():
            self._worker.join(timeout=30.0)
        return super().destroy_node()


def main(args=None) -> int:
    """`vla-spec-node [--ros-args --params-file config/robot.yaml ...]`."""
    rclpy.init(args=args)
    node = None
    try:
        node = VLASpecNode()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ValueError, ParameterException) as exc:   # bad parameters or checkpoint
        print(f'vla_spec: {exc}', file=sys.stderr)
        return 1
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
