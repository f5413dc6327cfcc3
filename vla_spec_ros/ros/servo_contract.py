"""MoveIt Servo's contract for one robot's commands (Servo of MoveIt 2 Jazzy and later).

Servo (moveit_servo's servo_node) acts on nothing until its command type is selected through
`<servo>/switch_command_type` (moveit_msgs/srv/ServoCommandType: JOINT_JOG 0, TWIST 1,
POSE 2); it halts when `now - header.stamp >= incoming_command_timeout` (its parameter
`moveit_servo.incoming_command_timeout`, 0.1 s by default); `<servo>/pause_servo`
(std_srvs/SetBool) pauses and resumes it; it resolves each command's frame_id through TF.

With `servo_node` set, each robot's channel keeps one `ServoContract`, which
  1. selects the command type matching what the node publishes (`servo_command_type`:
     twist on ~/twist, pose on ~/pose_target) on activation, and again on every new Servo
     instance: one whose service reappears after a clean stop, or one respawned beside the
     lingering entries of a Servo killed outright, told apart by the GIDs of the service's
     endpoints (servo_presence.py);
  2. holds the robot's commands until that selection is answered: `hold_reason()` says why
     a command may not go out (Servo not there, its type not selected yet or not again), and
     the channel holds (zero motion) instead of publishing what Servo would drop. It looks at
     the graph before every command, so a respawned Servo is caught before the next one;
  3. pauses Servo when the robot enters a hold (disabled, stale camera, failure, chunk run
     out, deactivation) and resumes it with the next command (`servo_pause_on_hold`): a
     paused Servo halts at once instead of waiting out its command timeout, and ignores other
     sources until the node acts again;
  4. reads `moveit_servo.incoming_command_timeout` through Servo's parameter service at once
     on every new instance and every TIMEOUT_REREAD_S (then follows /parameter_events, though
     Jazzy's Servo reads it at start-up only), and warns, in the log and /diagnostics at the
     same time, when it is below the node's measured frame -> command latency (p99) plus one
     control period: each command must stay fresh until the next one arrives, else Servo
     halts between actions; the log says when the warning is gone;
  5. reports all of this as `servo_*` values of the robot's /diagnostics status.

Service calls are asynchronous (never block a callback) and bounded (servo_calls.py: a killed
Servo never answers): the selection and the parameter read are sent again every
SELECT_RETRY_S until answered, a pause unanswered after CALL_TIMEOUT_S is given up and sent
again. moveit_msgs is imported here only: where it is missing the contract reports why (ERROR
in /diagnostics, one log line) and the node keeps publishing.
"""
from __future__ import annotations

import math
import threading
import time

from vla_spec_ros.ros.command_rules import REASON_SERVO_NOT_READY
from vla_spec_ros.ros.diagnostics import ERROR, OK, WARN
from vla_spec_ros.ros.late_callbacks import tolerating_destroyed
from vla_spec_ros.ros.node_clock_watch import steady_clock
from vla_spec_ros.ros.servo_calls import CallSlot
from vla_spec_ros.ros.servo_presence import server_gids, unselected

# moveit_msgs/srv/ServoCommandType's constants.
SERVO_COMMAND_TYPES = {'joint_jog': 0, 'twist': 1, 'pose': 2}
# Servo declares its parameters under the `moveit_servo` prefix (its ParamListener's name).
TIMEOUT_PARAMETER = 'moveit_servo.incoming_command_timeout'
CHECK_PERIOD_S = 0.1            # how often the contract looks at Servo's services
# An unanswered selection or parameter read goes out again this often: a respawned Servo drops
# calls until it has discovered the node, and the first call after that must not wait long.
SELECT_RETRY_S = 0.3
CALL_TIMEOUT_S = 1.0            # a pause or resume unanswered this long is given up
# A selection still unanswered this long is a failure in /diagnostics (`servo_last_failure`):
# longer than a respawned Servo takes to discover the node (2-3.5 s, servo_calls.py).
SELECT_FAILURE_S = 5.0
MAX_PENDING_CALLS = 8           # retried calls kept waiting for an answer, per kind
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
        # The servers of switch_command_type (their GIDs) the selection was answered for;
        # None: not selected (servo_presence.py).
        self._selected_on: frozenset | None = None
        self._servers = frozenset()              # as the graph listed them last
        self._servo_was_up = False
        self._ever_up = False
        self.num_restarts = 0                    # new Servo instances after the first
        self.paused: bool | None = None          # as Servo last confirmed; None: not known
        self.timeout_s: float | None = None
        self.error: str | None = None            # why the contract cannot be kept at all
        self.last_failure: str | None = None     # the last refused or failed call
        self._want_paused = False
        self._select_since: float | None = None  # when the unanswered selection began
        self._read_due = 0.0                     # time.monotonic of the next timeout read
        self._warned: tuple | None = None        # (timeout warned about, when) in the log
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
        self._select_calls = CallSlot(self._switch, SELECT_RETRY_S,
                                      max_pending=MAX_PENDING_CALLS)
        self._pause_calls = CallSlot(self._pause, CALL_TIMEOUT_S)
        self._read_calls = CallSlot(self._params, SELECT_RETRY_S,
                                    max_pending=MAX_PENDING_CALLS)
        # Steady: Servo's presence is checked whatever the node clock does (node_clock_watch).
        self._timer = node.create_timer(CHECK_PERIOD_S, tolerating_destroyed(self.check),
                                        clock=steady_clock())
        from rcl_interfaces.msg import ParameterEvent
        from rclpy.qos import qos_profile_parameter_events

        self._events = node.create_subscription(ParameterEvent, '/parameter_events',
                                                tolerating_destroyed(self._on_parameter_event),
                                                qos_profile_parameter_events)

    @property
    def type_selected(self) -> bool:
        return self._selected_on is not None

    # ---- what the channel tells it and asks it ------------------------------------------------

    def set_active(self, is_active: bool) -> None:
        """Activation selects the command type (again); deactivation pauses Servo (the channel
        publishes its zero through `on_hold` too)."""
        with self._lock:
            self.is_active = is_active
            self._select_since = None
            if is_active:
                self._selected_on = None
        self.check()

    def on_hold(self) -> None:
        """The robot entered a hold: pause Servo (when `pause_on_hold`)."""
        if self.pause_on_hold:
            self._want(True)

    def on_command(self) -> None:
        """A command is being published: Servo must not be paused."""
        self._want(False)

    def hold_reason(self) -> str | None:
        """Why a command must not go out now, or None: Servo is not there, or its command
        type is not selected on every Servo instance in the graph (it would drop the
        command). The graph is read first, so a Servo respawned since the last check is held
        for from this command on, and its selection goes out now. None when the contract
        cannot be kept at all (`error`: the node keeps publishing) or while inactive (the
        channel publishes nothing then anyway)."""
        if self.error is not None or not self.is_active:
            return None
        self._look()
        level, message = self._readiness()
        return None if level == OK else f'{REASON_SERVO_NOT_READY}: {message}'

    def _want(self, paused: bool) -> None:
        with self._lock:
            if self._want_paused == paused:
                return
            self._want_paused = paused
        self._sync_pause()

    # ---- the graph and the service calls --------------------------------------------------

    def check(self) -> None:
        """Timer (and activation): look for a new Servo and select the type when needed, give
        up unanswered pauses and keep the pause state, read Servo's timeout when due, and
        log the timeout warning when /diagnostics shows it."""
        if self.error is not None:
            return
        self._look()
        now = time.monotonic()
        with self._lock:
            read = now >= self._read_due and self._params.service_is_ready()
        if read:
            request = self._types[2].Request(names=[TIMEOUT_PARAMETER])
            self._read_calls.send(request, self._on_timeout_read, now)
        if self._pause_calls.expire(now):
            with self._lock:
                self.paused = None                  # it may or may not have been applied
            self.last_failure = f'pause_servo unanswered after {CALL_TIMEOUT_S} s'
        self._sync_pause()
        self._note_unanswered_selection(now)
        self._log_timeout_state(now)

    def _note_unanswered_selection(self, now: float) -> None:
        """A selection sent again and again without an answer (a Servo hung, or one that
        drops every call) is a failure of its own: before, `servo_last_failure` named only
        the pause calls, or nothing."""
        with self._lock:
            since = self._select_since
            waiting = (since is not None and self.is_active and self._servo_was_up
                       and self._selected_on is None and now - since >= SELECT_FAILURE_S)
        if waiting:
            self.last_failure = (f'switch_command_type to {self.command_type} unanswered for '
                                 f'{now - since:.0f} s')

    def _look(self) -> None:
        """Read the graph: a Servo gone, a (re)started or respawned one forgets the
        selection; then send the selection when one is needed."""
        is_up = self._switch.service_is_ready()
        servers = server_gids(self.node, self._switch.srv_name) if is_up else frozenset()
        now = time.monotonic()
        with self._lock:
            event = self._observe(is_up, servers, now)
            select = self.is_active and is_up and self._selected_on is None
            if select and self._select_since is None:
                self._select_since = now
        if event:
            self.node.get_logger().info(f'{self.label}: {event}')
        if select:
            request = self._types[0].Request()
            request.command_type = SERVO_COMMAND_TYPES[self.command_type]
            self._select_calls.send(request, lambda f: self._on_selected(f, servers), now)

    def _observe(self, is_up: bool, servers: frozenset, now: float) -> str | None:
        """(Under the lock.) What changed since the last look, as a log line, or None."""
        was_up, known = self._servo_was_up, self._servers
        self._servo_was_up, self._servers = is_up, servers
        if not is_up:
            if was_up:
                self._forget()
                return f'Servo {self.servo_node} is gone: holding until it is back'
            return None
        # A new instance: the service (re)appeared, or a server GID not listed before. The
        # first GIDs listed for a Servo already up are not one (the graph may list them a
        # moment after it reports the service): a selection made then covers them.
        is_new = not was_up or bool(known and servers - known)
        if not is_new and not known and self._selected_on is not None:
            self._selected_on |= servers
        if self._selected_on is not None and unselected(servers, self._selected_on):
            self._selected_on = None        # a server the type was not selected on
        if not is_new:
            return None
        self._forget()
        self._read_due = now                # its timeout, read at once
        if not self._ever_up:
            self._ever_up = True
            return None
        self.num_restarts += 1
        return (f'a new Servo instance at {self.servo_node}: selecting {self.command_type} '
                'again before the next command')

    def _forget(self) -> None:
        """(Under the lock.) What a Servo instance knew is gone with it."""
        self._selected_on = None
        self._select_since = None
        self.paused = None
        self.timeout_s = None
        self._select_calls.clear()
        self._read_calls.clear()

    def _sync_pause(self) -> None:
        if self.error is not None:
            return
        with self._lock:
            # An inactive node may pause Servo (its deactivation hold) but never resumes it.
            if (self.paused == self._want_paused
                    or (not self._want_paused and not self.is_active)
                    or not self._pause.service_is_ready()):
                return
            wanted = self._want_paused
        self._pause_calls.send(self._types[1].Request(data=wanted),
                               lambda future: self._on_paused(future, wanted),
                               time.monotonic())

    def _on_selected(self, future, servers: frozenset) -> None:
        response, failure = self._result(future, 'switch_command_type')
        is_selected = response is not None and response.success
        with self._lock:
            first = is_selected and self._selected_on is None
            if is_selected:
                self._selected_on = servers | (self._selected_on or frozenset())
                self._select_since = None
        if is_selected:
            self._select_calls.clear()      # one answer is enough
        if response is not None and not response.success:
            failure = f'switch_command_type to {self.command_type} refused by Servo'
        if failure:
            self.last_failure = failure
            self.node.get_logger().error(f'{self.label}: {failure}', throttle_duration_sec=5.0)
        elif first:
            self.node.get_logger().info(f'{self.label}: Servo {self.servo_node} accepts '
                                        f'{self.command_type} commands')

    def _on_paused(self, future, wanted: bool) -> None:
        response, failure = self._result(future, 'pause_servo')
        with self._lock:
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
            if timeout is not None:
                self.timeout_s = timeout
            if response is not None:        # answered (a Servo without the parameter too)
                self._read_due = time.monotonic() + TIMEOUT_REREAD_S
        self._read_calls.clear()
        if failure:
            self.last_failure = failure
        self._log_timeout_state(time.monotonic())

    def _on_parameter_event(self, event) -> None:
        """`ros2 param set <servo> moveit_servo.incoming_command_timeout ...` seen at once;
        Jazzy's Servo itself applies it only when it restarts, which the log says."""
        if event.node != self.servo_node:
            return
        for parameter in list(event.new_parameters) + list(event.changed_parameters):
            if parameter.name == TIMEOUT_PARAMETER and parameter.value.type == 3:
                value = parameter.value.double_value
                with self._lock:
                    changed = self.timeout_s is not None and value != self.timeout_s
                    self.timeout_s = value
                if changed:
                    self.node.get_logger().info(
                        f'{self.label}: {TIMEOUT_PARAMETER} set to {value:.3f} s on '
                        f'{self.servo_node}; MoveIt Servo (Jazzy) reads it at start-up, so '
                        'it applies once Servo restarts')

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

    def _readiness(self) -> tuple[int, str]:
        """(OK, '') when Servo acts on the node's commands, else (WARN, why not)."""
        if not self._servo_was_up:
            return WARN, f'waiting for {self.servo_node}/switch_command_type'
        if not self.type_selected:
            return WARN, f'selecting the {self.command_type} command type'
        return OK, ''

    def _log_timeout_state(self, now: float) -> None:
        """Log the timeout warning when /diagnostics shows it (`state`), again every
        TIMEOUT_REREAD_S while it lasts or when the timeout changes, and say when it is
        gone."""
        warning = self.timeout_warning() if self.is_active and self.type_selected else None
        with self._lock:
            timeout, warned = self.timeout_s, self._warned
            if warning is not None:
                if warned is not None and warned[0] == timeout \
                        and now - warned[1] < TIMEOUT_REREAD_S:
                    return
                self._warned = (timeout, now)
            elif warned is not None and timeout is not None and self.timeout_warning() is None:
                self._warned = None
            else:
                return
        if warning is not None:
            self.node.get_logger().warning(f'{self.label}: {warning}')
        else:
            self.node.get_logger().info(
                f'{self.label}: {TIMEOUT_PARAMETER} {timeout:.3f} s covers the frame -> '
                'command latency and one control period again')

    def state(self) -> tuple[int, str]:
        """(diagnostic level, message) of the contract."""
        if self.error is not None:
            return ERROR, self.error
        if not self.is_active:
            return OK, 'inactive'
        level, message = self._readiness()
        if level != OK:
            return level, message
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
                'servo_restarts': str(self.num_restarts),
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
