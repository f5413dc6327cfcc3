"""MoveIt Servo's contract for one robot's commands (Servo of MoveIt 2 Jazzy and later).

Servo (moveit_servo's servo_node) acts on nothing until its command type is selected through
`<servo>/switch_command_type` (moveit_msgs/srv/ServoCommandType: JOINT_JOG 0, TWIST 1,
POSE 2); it halts when `now - header.stamp >= incoming_command_timeout` (its parameter
`moveit_servo.incoming_command_timeout`, 0.1 s by default); `<servo>/pause_servo`
(std_srvs/SetBool) pauses and resumes it; it resolves each command's frame_id through TF.

With `servo_node` set, each robot's channel keeps one `ServoContract`, which
  1. selects the command type matching what the node publishes (`servo_command_type`:
     twist on ~/twist, pose on ~/pose_target) on activation, and again whenever Servo's
     service reappears (a restarted Servo forgets the selection);
  2. pauses Servo when the robot enters a hold (disabled, stale camera, failure, chunk run
     out, deactivation) and resumes it with the next command (`servo_pause_on_hold`): a
     paused Servo halts at once instead of waiting out its command timeout, and ignores other
     sources until the node acts again;
  3. reads `moveit_servo.incoming_command_timeout` through Servo's parameter service (then
     follows its changes on /parameter_events) and warns when it is below the node's
     measured frame -> command latency (p99) plus one control period: each command must stay
     fresh until the next one arrives, else Servo halts between actions;
  4. reports all of this as `servo_*` values of the robot's /diagnostics status.

Service calls are asynchronous (never block a callback); one call of each kind is in flight at
a time and the wanted state is re-sent when it changed meanwhile. moveit_msgs is imported here
only: where it is missing the contract reports why (ERROR in /diagnostics, one log line) and
the node keeps publishing.
"""
from __future__ import annotations

import math
import threading

from vla_spec_ros.ros.diagnostics import ERROR, OK, WARN

# moveit_msgs/srv/ServoCommandType's constants.
SERVO_COMMAND_TYPES = {'joint_jog': 0, 'twist': 1, 'pose': 2}
# Servo declares its parameters under the `moveit_servo` prefix (its ParamListener's name).
TIMEOUT_PARAMETER = 'moveit_servo.incoming_command_timeout'
CHECK_PERIOD_S = 0.5            # how often the contract looks at Servo's services
TIMEOUT_REREAD_S = 30.0         # Servo's timeout is read again this often (events can be lost)


def fully_qualified(name: str, namespace: str) -> str:
    """'/servo_node' stays; 'servo_node' in namespace '/cell1' -> '/cell1/servo_node'."""
    name = name.rstrip('/')
    if name.startswith('/'):
        return name
    return f'{namespace.rstrip("/")}/{name}'


def timeout_warning(timeout_s: float | None, latency_s: float | None,
                    control_period: float) -> str | None:
    """Why Servo would halt between the node's commands, or None: a command published
    `latency_s` after its image (its stamp) must stay younger than Servo's timeout until the
    next one, one control period later."""
    if timeout_s is None or latency_s is None or math.isnan(latency_s):
        return None
    needed = latency_s + control_period
    if timeout_s < needed:
        return (f'{TIMEOUT_PARAMETER} {timeout_s:.3f} s < frame -> command latency p99 '
                f'{latency_s:.3f} s + control_period {control_period:.3f} s: Servo halts '
                f'between actions; set it to at least {needed:.3f} s')
    return None


class ServoContract:
    """See the module docstring. `node`: the rclpy node; `servo_node`: Servo's node name
    ('/servo_node', relative names resolve in the node's namespace); `command_type`: a key of
    SERVO_COMMAND_TYPES; `measure() -> (latency_p99_s or None, control_period_s)`."""

    def __init__(self, node, servo_node: str, command_type: str, label: str, *,
                 pause_on_hold: bool, measure):
        if command_type not in SERVO_COMMAND_TYPES:
            raise ValueError(f'servo_command_type: {command_type!r} not in '
                             f'{list(SERVO_COMMAND_TYPES)}')
        self.node, self.label = node, label
        self.servo_node = fully_qualified(servo_node, node.get_namespace())
        self.command_type = command_type
        self.pause_on_hold = pause_on_hold
        self._measure = measure
        self._lock = threading.Lock()
        self.is_active = False
        self.type_selected = False
        self.paused: bool | None = None          # as Servo last confirmed; None: not known
        self.timeout_s: float | None = None
        self.error: str | None = None            # why the contract cannot be kept at all
        self.last_failure: str | None = None     # the last refused or failed call
        self._want_paused = False
        self._select_in_flight = self._pause_in_flight = self._read_in_flight = False
        self._servo_was_up = False
        self._since_read_s = math.inf
        self._clients, self._timer, self._events = [], None, None
        try:
            from moveit_msgs.srv import ServoCommandType
        except ImportError:
            self.error = ('moveit_msgs is not importable: Servo\'s command type cannot be '
                          'selected (install ros-<distro>-moveit-msgs)')
            node.get_logger().error(f'{label}: servo_node {servo_node!r}: {self.error}')
            return
        from rcl_interfaces.srv import GetParameters
        from std_srvs.srv import SetBool

        self._types = (ServoCommandType, SetBool, GetParameters)
        base = self.servo_node
        self._switch = node.create_client(ServoCommandType, f'{base}/switch_command_type')
        self._pause = node.create_client(SetBool, f'{base}/pause_servo')
        self._params = node.create_client(GetParameters, f'{base}/get_parameters')
        self._clients = [self._switch, self._pause, self._params]
        self._timer = node.create_timer(CHECK_PERIOD_S, self.check)
        from rcl_interfaces.msg import ParameterEvent
        from rclpy.qos import qos_profile_parameter_events

        self._events = node.create_subscription(ParameterEvent, '/parameter_events',
                                                self._on_parameter_event,
                                                qos_profile_parameter_events)

    # ---- what the channel tells it ------------------------------------------------------------

    def set_active(self, is_active: bool) -> None:
        """Activation selects the command type (again); deactivation pauses Servo (the channel
        publishes its zero through `on_hold` too)."""
        with self._lock:
            self.is_active = is_active
            if is_active:
                self.type_selected = False
        self.check()

    def on_hold(self) -> None:
        """The robot entered a hold: pause Servo (when `pause_on_hold`)."""
        if self.pause_on_hold:
            self._want(True)

    def on_command(self) -> None:
        """A command is being published: Servo must not be paused."""
        self._want(False)

    def _want(self, paused: bool) -> None:
        with self._lock:
            if self._want_paused == paused:
                return
            self._want_paused = paused
        self._sync_pause()

    # ---- service calls ------------------------------------------------------------------------

    def check(self) -> None:
        """Timer (and activation): select the type when needed, keep the pause state, read
        Servo's timeout now and then."""
        if self.error is not None:
            return
        is_up = self._switch.service_is_ready()
        with self._lock:
            if is_up and not self._servo_was_up:
                self.type_selected = False          # a (re)started Servo
            self._servo_was_up = is_up
            select = (is_up and self.is_active and not self.type_selected
                      and not self._select_in_flight)
            if select:
                self._select_in_flight = True
            self._since_read_s += CHECK_PERIOD_S
            read = (self._params.service_is_ready() and not self._read_in_flight
                    and self._since_read_s >= TIMEOUT_REREAD_S)
            if read:
                self._read_in_flight, self._since_read_s = True, 0.0
        if select:
            request = self._types[0].Request()
            request.command_type = SERVO_COMMAND_TYPES[self.command_type]
            self._switch.call_async(request).add_done_callback(self._on_selected)
        if read:
            request = self._types[2].Request(names=[TIMEOUT_PARAMETER])
            self._params.call_async(request).add_done_callback(self._on_timeout_read)
        self._sync_pause()

    def _sync_pause(self) -> None:
        if self.error is not None:
            return
        with self._lock:
            # An inactive node may pause Servo (its deactivation hold) but never resumes it.
            if (self._pause_in_flight or self.paused == self._want_paused
                    or (not self._want_paused and not self.is_active)
                    or not self._pause.service_is_ready()):
                return
            self._pause_in_flight = True
            wanted = self._want_paused
        self._pause.call_async(self._types[1].Request(data=wanted)).add_done_callback(
            lambda future: self._on_paused(future, wanted))

    def _on_selected(self, future) -> None:
        response, failure = self._result(future, 'switch_command_type')
        with self._lock:
            self._select_in_flight = False
            self.type_selected = bool(response is not None and response.success)
        if response is not None and not response.success:
            failure = f'switch_command_type to {self.command_type} refused by Servo'
        if failure:
            self.last_failure = failure
            self.node.get_logger().error(f'{self.label}: {failure}', throttle_duration_sec=5.0)
        else:
            self.node.get_logger().info(f'{self.label}: Servo {self.servo_node} accepts '
                                        f'{self.command_type} commands')

    def _on_paused(self, future, wanted: bool) -> None:
        response, failure = self._result(future, 'pause_servo')
        with self._lock:
            self._pause_in_flight = False
            if response is not None and response.success:
                self.paused = wanted
        if response is not None and not response.success:
            failure = f'pause_servo {wanted} refused: {response.message}'
        if failure:
            self.last_failure = failure
            self.node.get_logger().warning(f'{self.label}: {failure}',
                                           throttle_duration_sec=5.0)
        else:                           # the wanted state may have changed meanwhile; after
            self._sync_pause()          # a failure the timer's next check retries

    def _on_timeout_read(self, future) -> None:
        response, failure = self._result(future, 'get_parameters')
        timeout = None
        if response is not None and response.values:
            value = response.values[0]
            if value.type == 3:         # rcl_interfaces/ParameterType PARAMETER_DOUBLE
                timeout = value.double_value
        with self._lock:
            self._read_in_flight = False
            if timeout is not None:
                self.timeout_s = timeout
        warning = self.timeout_warning()
        if warning:
            self.node.get_logger().warning(f'{self.label}: {warning}',
                                           throttle_duration_sec=30.0)

    def _on_parameter_event(self, event) -> None:
        """`ros2 param set <servo> moveit_servo.incoming_command_timeout ...` seen at once."""
        if event.node != self.servo_node:
            return
        for parameter in list(event.new_parameters) + list(event.changed_parameters):
            if parameter.name == TIMEOUT_PARAMETER and parameter.value.type == 3:
                with self._lock:
                    self.timeout_s = parameter.value.double_value

    @staticmethod
    def _result(future, what: str):
        try:
            return future.result(), None
        except Exception as exc:        # the service went away mid-call
            return None, f'{what} failed: {exc}'

    # ---- state ------------------------------------------------------------------------------

    def timeout_warning(self) -> str | None:
        latency_s, control_period = self._measure()
        return timeout_warning(self.timeout_s, latency_s, control_period)

    def state(self) -> tuple[int, str]:
        """(diagnostic level, message) of the contract."""
        if self.error is not None:
            return ERROR, self.error
        if not self.is_active:
            return OK, 'inactive'
        if not self._servo_was_up:
            return WARN, f'waiting for {self.servo_node}/switch_command_type'
        if not self.type_selected:
            return WARN, f'selecting the {self.command_type} command type'
        warning = self.timeout_warning()
        if warning:
            return WARN, warning
        return OK, 'paused (hold)' if self.paused else f'accepting {self.command_type}'

    def diagnostic_values(self) -> dict:
        """The servo_* values of the robot's /diagnostics status, as strings."""
        _, message = self.state()
        timeout = self.timeout_s
        paused = 'unknown' if self.paused is None else str(self.paused).lower()
        return {'servo_node': self.servo_node, 'servo_command_type': self.command_type,
                'servo_type_selected': str(self.type_selected).lower(),
                'servo_paused': paused,
                'servo_incoming_command_timeout_s': 'unknown' if timeout is None
                else f'{timeout:.3f}',
                'servo_state': message, 'servo_last_failure': self.last_failure or ''}

    def add_to_status(self, status) -> None:
        """Adds the contract to a robot's diagnostic_msgs/DiagnosticStatus: its values, and
        its level and message where they are worse than the robot's own."""
        from diagnostic_msgs.msg import KeyValue

        level, message = self.state()
        status.values.extend(KeyValue(key=k, value=v)
                             for k, v in self.diagnostic_values().items())
        if level > status.level[0]:
            status.level = bytes([level])
            status.message = f'servo: {message}'

    def destroy(self) -> None:
        if self._timer is not None:
            self.node.destroy_timer(self._timer)
        if self._events is not None:
            self.node.destroy_subscription(self._events)
        for client in self._clients:
            self.node.destroy_client(client)
        self._clients, self._timer, self._events = [], None, None


__all__ = ['ServoContract', 'SERVO_COMMAND_TYPES', 'TIMEOUT_PARAMETER', 'timeout_warning']
