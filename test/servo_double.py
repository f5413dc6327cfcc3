"""A stand-in for MoveIt Servo (moveit_servo's servo_node, Jazzy and later) that keeps its
documented command contract, for the node's integration tests over DDS.

What it implements, as MoveIt's documentation and servo_node state it:
  * no command type is selected at start; `~/switch_command_type`
    (moveit_msgs/srv/ServoCommandType) selects JOINT_JOG (0), TWIST (1) or POSE (2) and answers
    success = false for any other value; a command of a type other than the selected one is
    not acted on;
  * a command is acted on only while `now - header.stamp < incoming_command_timeout` (its
    parameter `moveit_servo.incoming_command_timeout`, default 0.1 s); an older one halts;
  * `~/pause_servo` (std_srvs/SetBool) pauses (data true) and resumes (false); while paused
    no command is acted on, but the newest one is kept: servo_node's loop skips its work while
    paused and, once resumed, acts on the newest command if it is still fresh;
  * a command's frame_id must resolve (here: be one of `known_frames`, in place of TF);
    an empty or unknown frame is refused;
  * commands: TwistStamped on `~/delta_twist_cmds`, PoseStamped on `~/pose_target_cmds`.

Every command is kept with its verdict ('executed' or the reason it was not), and every
service call in order, for the test to read.

In its own process (`python3 test/servo_double.py --name servo_node --namespace /arm_a
--timeout 0.1`, the environment of ros_interfaces.node_env so moveit_msgs imports), as a
launch file runs Servo: it prints one JSON object per line, flushed, for the test to read
(ServoProcess in test/servo_process.py): `ready` once its services and subscriptions exist,
then every service call and every command with its verdict, each with the time it happened
(system clock seconds, the clock of every process on the machine). It exits 0 on SIGINT; a
SIGKILL leaves its entries in DDS discovery, as a crashed Servo's.
"""
import argparse
import json
import os
import sys
import threading
import time

from geometry_msgs.msg import PoseStamped, TwistStamped
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from std_srvs.srv import SetBool

JOINT_JOG, TWIST, POSE = 0, 1, 2
EXECUTED = 'executed'


class ServoDouble(Node):

    def __init__(self, name='servo_node', *, timeout_s=0.1, known_frames=('base_link',),
                 on_event=None, **node_kwargs):
        super().__init__(name, **node_kwargs)
        from moveit_msgs.srv import ServoCommandType

        self.declare_parameter('moveit_servo.incoming_command_timeout', float(timeout_s))
        self.known_frames = set(known_frames)
        self._lock = threading.Lock()
        self.command_type = None
        self.paused = False
        self.commands = []          # (time s, kind, message, verdict), receipt or resume
        self._newest = None         # (kind, message) of the newest command received
        self.calls = []             # ('switch_command_type', value, success) / ('pause', bool)
        self._on_event = on_event   # on_event(dict) for each call and command, under the lock
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        self.create_service(ServoCommandType, '~/switch_command_type', self._on_switch)
        self.create_service(SetBool, '~/pause_servo', self._on_pause)
        self.create_subscription(TwistStamped, '~/delta_twist_cmds',
                                 lambda msg: self._on_command(TWIST, msg), qos)
        self.create_subscription(PoseStamped, '~/pose_target_cmds',
                                 lambda msg: self._on_command(POSE, msg), qos)

    @property
    def timeout_s(self) -> float:
        return self.get_parameter('moveit_servo.incoming_command_timeout').value

    def _on_switch(self, request, response):
        response.success = request.command_type in (JOINT_JOG, TWIST, POSE)
        with self._lock:
            if response.success:
                self.command_type = request.command_type
            self.calls.append(('switch_command_type', request.command_type, response.success))
            self._event('call', name='switch_command_type', value=request.command_type,
                        success=response.success)
        return response

    def _on_pause(self, request, response):
        now_s = self.get_clock().now().nanoseconds * 1e-9
        with self._lock:
            was_paused, self.paused = self.paused, bool(request.data)
            self.calls.append(('pause', self.paused))
            self._event('call', name='pause', value=self.paused, success=True)
            if was_paused and not self.paused and self._newest is not None:
                kind, msg = self._newest      # the newest command, looked at again on resume
                if self.commands and self.commands[-1][3] == 'paused':
                    self._keep(now_s, kind, msg)
        response.success = True
        response.message = 'paused' if request.data else 'resumed'
        return response

    def _verdict(self, kind, msg, now_s) -> str:
        if self.command_type is None:
            return 'no command type selected'
        if kind != self.command_type:
            return f'command type {kind} while {self.command_type} is selected'
        if self.paused:
            return 'paused'
        if msg.header.frame_id not in self.known_frames:
            return f'unknown frame {msg.header.frame_id!r}'
        stamp_s = msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec
        if now_s - stamp_s >= self.timeout_s:
            return 'stale command: halt'
        return EXECUTED

    def _on_command(self, kind, msg):
        now_s = self.get_clock().now().nanoseconds * 1e-9
        with self._lock:
            self._newest = (kind, msg)
            self._keep(now_s, kind, msg)

    def _keep(self, now_s, kind, msg) -> None:
        verdict = self._verdict(kind, msg, now_s)
        self.commands.append((now_s, kind, msg, verdict))
        self._event('command', kind=kind, verdict=verdict, is_zero=is_zero_command(kind, msg),
                    stamp=msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec)

    def _event(self, event: str, **values) -> None:
        if self._on_event is not None:
            self._on_event(dict(event=event, t=time.time(), **values))

    def snapshot(self):
        with self._lock:
            return list(self.commands), list(self.calls)


def is_zero_command(kind, msg) -> bool:
    """A twist of zero velocity (a pose target is never "zero")."""
    if kind != TWIST:
        return False
    t = msg.twist
    return all(v == 0.0 for v in (t.linear.x, t.linear.y, t.linear.z,
                                  t.angular.x, t.angular.y, t.angular.z))


def main(argv=None) -> int:
    """Servo in its own process, printing its events (module docstring)."""
    import rclpy
    from rclpy.executors import ExternalShutdownException

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--name', default='servo_node')
    parser.add_argument('--namespace', default='/')
    parser.add_argument('--timeout', type=float, default=0.1,
                        help='moveit_servo.incoming_command_timeout, s')
    options = parser.parse_args(argv)
    lock = threading.Lock()

    def emit(event: dict) -> None:
        with lock:
            sys.stdout.write(json.dumps(event) + '\n')
            sys.stdout.flush()

    rclpy.init()
    servo = ServoDouble(options.name, namespace=options.namespace, timeout_s=options.timeout,
                        on_event=emit)
    emit(dict(event='ready', t=time.time(), pid=os.getpid(),
              node=servo.get_fully_qualified_name()))
    try:
        rclpy.spin(servo)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        servo.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == '__main__':
    sys.exit(main())
