"""The `sim_bridge` node: a Meta-World task as a camera + arm on ROS 2 (README, "The embedded
model").

  ~/image (sensor_msgs/Image rgb8, stamped with the node clock, strictly increasing per frame)
  ~/instruction (std_msgs/String, reliable + transient local like the VLA node's subscription)
  ~/twist (geometry_msgs/TwistStamped) + ~/gripper (std_msgs/Float64MultiArray, data[0])
      -> twist_to_action.action_from_twist -> MetaWorldTask.step

Connect it to a `vla_spec` node by remapping, e.g. `~/image:=/vla_spec/image`,
`~/instruction:=/vla_spec/instruction`, `~/twist:=/vla_spec/twist`, `~/gripper:=/vla_spec/gripper`.
control_period, linear/angular_scale, max_*_speed and gripper_*_position must equal the VLA
node's. Simplest gripper convention on the VLA node: gripper_binarize false, open 1.0, closed
0.0 (the message then carries the model's gripper value clipped to [0, 1]).

Twists answering published frames are paired with gripper messages in arrival order over the
node's whole life (answer_pairing.AnswerPairs); a chunked model's steps (stamped frame + i
control periods) pair the same way. In lock-step a frame is stepped with the first step
published for it (the rest of its chunk is counted, not applied: `vla-spec demo` refuses
lock-step for chunked models); in real time every step is applied as it arrives.
sim_mode "lockstep": frame k is stepped only with the pair whose twist carries frame k's stamp
(lockstep_matching.LockstepMatcher); without it for `lockstep_timeout_s` the same frame is
published again with the same stamp (counted) and nothing is stepped, and after `max_republish`
republications the episode ends unsuccessfully (`is_unanswered`, end reason "unanswered"). With
`action_delay` d > 0 (delayed lock-step, delayed_lockstep.DelayedLockstep) the action decided from
period k's frame is applied at period k + d, `delay_hold` holding in between; with
`delay_frames: one_in_flight` the frames of the periods in between are not published (the model
would be busy) and the held action is applied at once. "realtime": a timer steps at
`control_rate_hz` with the newest due command (stamped no later than the stepped state + half
a period) younger than `command_timeout_s`, else zero motion with the gripper held
(realtime_clock.RealtimeCommand); answers to a previous episode's frames are
ignored. With `camera_delay` d > 0 (real time only, realtime_clock.DelayedCamera) the frame
rendered at period t is published at period t + d with its capture stamp: the node sees an image
d periods old, and executes a chunk time-aligned by that stamp. Ticks that came more than 1.5
periods after the previous one are counted (`num_late_ticks`: the machine did not keep the
rate). Latencies (frame published -> first answer) are recorded for this episode's frames only.
The last frame of an episode (success or max_steps) is not published, nor are frames still
waiting out the camera delay when it ends.

Simulator work runs in this node's callbacks (one mutually exclusive group) and in the caller of
`start_episode` / `run_episode`, serialised by one lock. Call `run_episode` from a thread other
than the executor's (it blocks until the episode ends).
"""
from __future__ import annotations

import dataclasses
import sys
import threading
import time

import numpy as np
import rclpy
from geometry_msgs.msg import TwistStamped
from rcl_interfaces.msg import ParameterDescriptor
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node
from sensor_msgs.msg import Image
from std_msgs.msg import Float64MultiArray, String

from vla_spec_ros.harness.node_threads import NodeThreads
from vla_spec_ros.image_messages import rgb_to_image
from vla_spec_ros.ros.qos import COMMAND_QOS, IMAGE_PUBLISHER_QOS, INSTRUCTION_QOS
from vla_spec_ros.sim.answer_pairing import AnswerPairs, FrameRegistry, next_stamp_ns
from vla_spec_ros.sim.bridge_settings import DESCRIPTIONS, BridgeSettings
from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
from vla_spec_ros.sim.demos import EpisodeResult, choose_instruction, episode_seed
from vla_spec_ros.sim.episode_records import (
    END_MAX_STEPS, END_STOPPED, END_SUCCESS, END_TIMEOUT, END_UNANSWERED, EpisodeLog)
from vla_spec_ros.sim.lockstep_matching import LockstepMatcher
from vla_spec_ros.sim.metaworld_env import get_task, make_env
from vla_spec_ros.sim.realtime_clock import (
    DelayedCamera, RealtimeCommand, TickMonitor, answer_lag, due_stamp_ns)
from vla_spec_ros.sim.twist_to_action import action_from_twist, gripper_openness

MAX_TIMER_PERIOD_S = 0.05


class SimBridgeNode(Node):
    """One Meta-World task at a time behind camera / instruction / twist / gripper topics."""

    def __init__(self, *, node_name: str = 'sim_bridge', **node_kwargs):
        super().__init__(node_name, **node_kwargs)
        defaults = BridgeSettings()
        declared = self.declare_parameters('', [
            (f.name, getattr(defaults, f.name), ParameterDescriptor(
                description=DESCRIPTIONS[f.name])) for f in dataclasses.fields(defaults)])
        self.settings = BridgeSettings(**{p.name: p.value for p in declared})
        s = self.settings
        self._lock = threading.RLock()
        self._done = threading.Event()
        self._env = None
        self._envs: dict = {}      # (task, image_size, camera, max_steps) -> MetaWorldTask
        # One registry and one answer FIFO pair for the node's life (answer_pairing module doc).
        self._registry = FrameRegistry()
        # Chunk steps are stamped frame + i control periods (answer_pairing module doc).
        self._answers = AnswerPairs(self._registry, chunk_period_s=s.control_period)
        self._matcher = LockstepMatcher(self._answers, s.max_republish)
        self._realtime = RealtimeCommand(self._answers, s.command_timeout_s,
                                         s.gripper_open_position)
        self._delay = DelayedLockstep(
            s.action_delay, s.delay_hold, s.delay_frames,
            initial_gripper=gripper_openness(s.gripper_open_position, s))
        # Real time: frames between capture and publication, and the ticks' regularity.
        self._camera = DelayedCamera(s.camera_delay)
        self._frame_periods: dict = {}         # this episode's frame stamps -> capture period
        self._ticks = TickMonitor(1.0 / s.control_rate_hz)
        self._period = 0                       # control period of the running episode
        self._log = EpisodeLog()
        self._episode: tuple | None = None     # (task_name, seed, instruction) while running
        self._first_stamp_ns: int | None = None   # the running (or last) episode's first frame
        self._frame_msg, self._frame_sent_s, self._last_stamp_ns = None, 0.0, None
        self._started_s, self._last_instruction = 0.0, None

        self._image_pub = self.create_publisher(Image, '~/image', IMAGE_PUBLISHER_QOS)
        self._instruction_pub = self.create_publisher(String, '~/instruction', INSTRUCTION_QOS)
        self._twist_sub = self.create_subscription(TwistStamped, '~/twist', self._on_twist,
                                                   COMMAND_QOS)
        self._gripper_sub = self.create_subscription(Float64MultiArray, '~/gripper',
                                                     self._on_gripper, COMMAND_QOS)
        self._control_timer = None
        if s.sim_mode == 'realtime':
            self._control_timer = self.create_timer(1.0 / s.control_rate_hz,
                                                    self._on_control_tick)
        else:
            self.create_timer(min(MAX_TIMER_PERIOD_S, s.lockstep_timeout_s / 4),
                              self._on_lockstep_tick)

    # ---- episode API (caller thread) ------------------------------------------------------

    def wait_for_peers(self, timeout_s: float) -> bool:
        """True once ~/image has a subscriber and ~/twist and ~/gripper have publishers."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (self._image_pub.get_subscription_count() > 0
                    and self._twist_sub.get_publisher_count() > 0
                    and self._gripper_sub.get_publisher_count() > 0):
                return True
            time.sleep(0.01)
        return False

    def start_episode(self, task_name: str, seed: int, instruction: str) -> None:
        """Reset the task with `seed`, publish the instruction, then the first frame."""
        if not instruction:
            raise ValueError('instruction: must not be empty')
        self.stop_episode()
        if instruction != self._last_instruction:
            self._instruction_pub.publish(String(data=instruction))
            self._last_instruction = instruction
            time.sleep(self.settings.instruction_settle_s)   # let subscribers take it first
        with self._lock:
            env = self._ensure_env(task_name)
            image = env.reset(int(seed))
            self._log = EpisodeLog()
            self._matcher.begin_episode()     # fresh counts; the answer FIFOs carry over
            self._delay.begin_episode()
            self._camera.begin_episode()
            self._frame_periods.clear()
            self._period = 0
            self._done.clear()
            self._episode = (env.task.name, int(seed), instruction)
            if self._control_timer is not None:
                # The first frame is captured at a tick of its own: period t's frame is then
                # t control periods after the first, as the node's chunk slots assume.
                self._control_timer.reset()
            self._started_s = time.monotonic()
            self._ticks.begin_episode(self._started_s)
            self._first_stamp_ns = self._take_frame(image)
            # No command carried over; a previous episode's answers are ignored from now on.
            self._realtime.begin_episode(self._first_stamp_ns,
                                         self.settings.gripper_open_position)

    def run_episode(self, task_name: str, seed: int, instruction: str,
                    timeout_s: float) -> EpisodeResult:
        """Run one episode to success, max_steps or `timeout_s` (then `is_timed_out`)."""
        self.start_episode(task_name, seed, instruction)
        if not self._done.wait(timeout_s):
            with self._lock:
                if self._episode is not None:
                    self._log.counters.is_timed_out = True
                    self._finish(is_success=False, reason=END_TIMEOUT)
        return self._log.result

    def stop_episode(self) -> None:
        """End a running episode now (not successful)."""
        with self._lock:
            if self._episode is not None:
                self._finish(is_success=False, reason=END_STOPPED)

    def episode_log(self) -> EpisodeLog:
        """A copy of the current (or last) episode's counters, actions and latencies."""
        with self._lock:
            log = self._log
            return EpisodeLog(dataclasses.replace(log.counters),
                              list(log.applied_actions), list(log.latencies_s),
                              log.wall_s, log.result, log.end_reason)

    @property
    def env(self):
        return self._env

    def destroy_node(self):
        """End a running episode (a waiting `run_episode` returns), then close the simulator."""
        with self._lock:
            if self._episode is not None:
                self._finish(is_success=False, reason=END_STOPPED)
            self._done.set()
            for env in self._envs.values():
                env.close()
            self._envs.clear()
            self._env = None
        return super().destroy_node()

    # ---- simulator (lock held) ------------------------------------------------------------

    def _ensure_env(self, task_name: str):
        # One environment per task, kept until destroy_node: an OSMesa context freed while it
        # is still current on an executor thread crashes the next MakeCurrent on that thread
        # (observed as a segfault in libOSMesa when switching tasks mid-run).
        s = self.settings
        key = (get_task(task_name).name, s.image_size, s.camera, s.max_steps)
        if key not in self._envs:
            self._envs[key] = make_env(key[0], image_size=s.image_size, camera=s.camera,
                                       max_steps=s.max_steps)
        self._env = self._envs[key]
        return self._env

    def _take_frame(self, image: np.ndarray) -> int:
        """Stamp a new frame now (above every earlier stamp: the time of capture) and publish
        it, in real time after the camera delay (then with the frames now due); its stamp."""
        now = self.get_clock().now().nanoseconds
        stamp_ns = next_stamp_ns(now, self._last_stamp_ns)
        self._last_stamp_ns = stamp_ns
        msg = rgb_to_image(image, frame_id=self.settings.frame_id)
        msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 1_000_000_000)
        if self.settings.sim_mode == 'lockstep':
            self._publish_frame(stamp_ns, msg)
            return stamp_ns
        period = self._log.counters.num_steps       # the frame of control period t
        self._frame_periods[stamp_ns] = period
        self._camera.capture(period, (stamp_ns, msg))
        for due_frame_stamp_ns, due_msg in self._camera.due(period):
            self._publish_frame(due_frame_stamp_ns, due_msg)
        return stamp_ns

    def _publish_frame(self, stamp_ns: int, msg: Image) -> None:
        """Publish a stamped frame (registered when published: latency starts here)."""
        self._frame_sent_s = time.monotonic()
        self._registry.add(stamp_ns, self._frame_sent_s)
        if self.settings.sim_mode == 'lockstep':
            self._matcher.begin_frame(stamp_ns)
        self._frame_msg = msg
        self._image_pub.publish(msg)
        self._log.counters.num_frames_published += 1

    def _apply(self, action: np.ndarray, is_command: bool) -> np.ndarray | None:
        """One simulator step; the next image, or None when the episode ended."""
        counters = self._log.counters
        image, is_success, is_done, _ = self._env.step(action)
        counters.num_steps += 1
        counters.num_commands_applied += int(is_command)
        counters.num_stale_commands += int(not is_command)
        self._log.applied_actions.append(np.array(action, dtype=np.float64))
        if is_done:
            self._finish(is_success, reason=END_SUCCESS if is_success
                         else END_MAX_STEPS)
            return None
        return image

    def _finish(self, is_success: bool, reason: str) -> None:
        task_name, seed, instruction = self._episode
        self._episode = None
        self._matcher.end()
        self._log.counters.num_other_answers = (
            self._matcher.num_other_answers if self.settings.sim_mode == 'lockstep'
            else self._realtime.num_ignored_answers)
        self._log.end_reason = reason
        self._log.wall_s = time.monotonic() - self._started_s
        num_steps = self._env.num_steps if self._env is not None else 0
        self._log.result = EpisodeResult(task_name, seed, instruction, bool(is_success),
                                         num_steps)
        self._done.set()

    # ---- callbacks (executor) -------------------------------------------------------------

    def _on_twist(self, msg: TwistStamped) -> None:
        received_s = time.monotonic()
        t = msg.twist
        linear = (t.linear.x, t.linear.y, t.linear.z)
        angular = (t.angular.x, t.angular.y, t.angular.z)
        if not np.all(np.isfinite(linear + angular)):
            # Paired all the same (its gripper follows), but never applied
            # (answer_pairing.AnswerPairs).
            self.get_logger().warning(f'ignoring non-finite twist {linear} {angular}',
                                      throttle_duration_sec=2.0)
        stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec
        with self._lock:
            located = self._registry.frame_of(stamp_ns, self.settings.control_period)
            latency = None if located is None else self._registry.first_answer_latency(
                located[0], received_s)
            if (latency is not None and self._episode is not None
                    and located[0] >= self._first_stamp_ns):  # not a previous episode's frame
                self._log.latencies_s.append(latency)
            if self.settings.sim_mode == 'realtime':
                self._realtime.on_twist(stamp_ns, linear, angular, received_s)
            else:
                self._matcher.on_twist(stamp_ns, linear, angular)
                self._step_lockstep()

    def _on_gripper(self, msg: Float64MultiArray) -> None:
        position = float(msg.data[0]) if len(msg.data) >= 1 else float('nan')
        if not np.isfinite(position):
            # Paired with its twist all the same (NaN is never applied), keeping the order.
            self.get_logger().warning(f'ignoring gripper command {list(msg.data)}',
                                      throttle_duration_sec=2.0)
        with self._lock:
            if self.settings.sim_mode == 'realtime':
                self._realtime.on_gripper(position)
            else:
                self._matcher.on_gripper(position)
                self._step_lockstep()

    def _step_lockstep(self) -> None:
        command = self._matcher.take()      # pops every complete pair, episode or not
        if command is None or self._episode is None:
            return
        self._delay.answer(self._period, self._action(command.linear, command.angular,
                                                      command.gripper_position))
        while True:      # step until a period whose frame goes to the policy, or the end
            action, is_fresh = self._delay.action_at(self._period)
            image = self._apply(action, is_command=is_fresh)
            self._period += 1
            if image is None:
                return
            if self._delay.wants_frame(self._period):
                self._take_frame(image)
                return

    def _action(self, linear, angular, gripper_position) -> np.ndarray:
        return action_from_twist(linear, angular, gripper_position, self.settings)

    def _on_lockstep_tick(self) -> None:
        with self._lock:
            if (self._episode is None or time.monotonic() - self._frame_sent_s
                    < self.settings.lockstep_timeout_s):
                return
            is_republished = self._matcher.should_republish()
            if is_republished:
                self._frame_sent_s = time.monotonic()    # same message, same stamp
                self._image_pub.publish(self._frame_msg)
                self._log.counters.num_frames_published += 1
                self._log.counters.num_republished_frames += 1
            else:          # the answer is held every time (e.g. an invalid action): give up
                self._log.counters.is_unanswered = True
                self._finish(is_success=False, reason=END_UNANSWERED)
        s = self.settings
        if is_republished:
            self.get_logger().warning(f'no command for the current frame within '
                                      f'{s.lockstep_timeout_s} s; republished it',
                                      throttle_duration_sec=2.0)
        else:
            self.get_logger().error(f'no command for the current frame after {s.max_republish} '
                                    'republications; episode failed (see the VLA node\'s log)')

    def _on_control_tick(self) -> None:
        with self._lock:
            if self._episode is None:
                return
            now = time.monotonic()
            self._ticks.on_tick(now)
            counters = self._log.counters
            counters.num_late_ticks = self._ticks.num_late_ticks
            counters.max_tick_gap_s = self._ticks.max_gap_s
            # The state being stepped is the newest frame captured (published or not).
            linear, angular, gripper, is_fresh = self._realtime.command_at(
                now, due_stamp_ns(self._last_stamp_ns, self.settings.control_period))
            counters.num_hold_commands += int(is_fresh and self._realtime.is_hold)
            source = self._realtime.source if is_fresh else None
            if source is not None and source[0] in self._frame_periods:
                # This step acts on the state of period num_steps (the frame of that period).
                lag = answer_lag(counters.num_steps, self._frame_periods[source[0]],
                                 source[1])
                counters.num_answer_steps += 1
                counters.answer_lag_sum += lag
                counters.num_answer_steps_on_time += int(lag == 0)
                counters.num_answer_steps_early += int(lag < 0)
            image = self._apply(self._action(linear, angular, gripper), is_command=is_fresh)
            if image is not None:
                self._take_frame(image)


def main(args=None) -> int:
    """`ros2 run vla_spec_ros sim-bridge --ros-args -p task_name:=drawer-open -p episodes:=5
    -r ~/image:=/vla_spec/image ...`: runs the episodes and logs each result."""
    from vla_spec_ros.ros.node import wants_help

    if wants_help(args):
        print('usage: vla-spec-sim-bridge [--ros-args -p task_name:=NAME -p episodes:=N '
              '-r ~/image:=... ...]\n\nRuns Meta-World episodes against a VLA node over ROS '
              '2 topics and logs each result (docs/demo.md, "The simulator behind the node").')
        return 0
    rclpy.init(args=args)
    node, spinning = None, None
    try:
        node = SimBridgeNode()
        spinning = NodeThreads(None, [[node]], name='sim_bridge')   # the default context
        s, log = node.settings, node.get_logger()
        task = get_task(s.task_name)
        if not node.wait_for_peers(30.0):
            log.warning('no VLA node connected yet (check the remappings); starting anyway')
        num_success = 0
        for episode in range(s.episodes):
            seed = episode_seed(s.seed, task.name, episode)
            instruction = s.instruction or choose_instruction(task, seed)
            result = node.run_episode(task.name, seed, instruction, s.episode_timeout_s)
            episode_log = node.episode_log()
            num_success += int(result.is_success)
            log.info(f'episode {episode}: {result} ended by {episode_log.end_reason}: '
                     f'{episode_log.counters}')
        log.info(f'{task.name}: success {num_success}/{s.episodes}')
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except ValueError as exc:
        print(f'sim_bridge: {exc}', file=sys.stderr)
        return 1
    finally:
        if spinning is not None:     # the spin thread ends before the node is destroyed
            spinning.shutdown(timeout_s=5.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
