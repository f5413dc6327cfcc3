"""MoveIt Servo's contract kept by the real node over DDS (vla_spec_ros/ros/servo_contract.py).

Servo is not installable here; test/servo_double.py stands in for it, keeping its documented
contract (command type required, stamp timeout, pause service, frame check), and moveit_msgs'
ServoCommandType is generated from its interface file (test/ros_interfaces.py). The node runs
in this process with `~/twist` (or `~/pose_target`) remapped onto the double's input, as a
launch file would remap it onto Servo's.

Checked: without `servo_node` the double never acts on the node's twists (no type selected);
with it the node selects TWIST and its commands are acted on; a hold (disable) pauses Servo
and fresh frames after enabling resume it; a frame_id Servo cannot resolve is refused; a
Servo timeout below the node's latency + one control period turns the robot's /diagnostics
status to WARN, naming the parameter. The pure timeout rule is tested on its own, and so are
the bookkeeping of calls Servo may never answer (servo_calls.py) and the rule that tells a new
Servo by its service's endpoints (servo_presence.py). Servo in its own process, killed and
respawned: test_servo_respawn.py.
"""
import importlib.util
import itertools
import math
import os
import sys

import numpy as np
import pytest

from vla_spec_ros.ros.servo_contract import (SERVO_COMMAND_TYPES, fully_qualified,
                                             timeout_warning)

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
needs_ros = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                               reason='needs rclpy + ROS message wheels and torch')
DOMAIN_ID = 191 + (os.getpid() % 20)     # Fast DDS takes domains 0..232 only
INSTRUCTION = 'wipe the table'
UNNORM_KEY = 'bridge_orig'
TIMEOUT = 30.0
RUNS = itertools.count()


# ---- pure rules ---------------------------------------------------------------------------------

def test_servo_command_type_constants_are_moveit_msgs():
    # moveit_msgs/srv/ServoCommandType.srv: JOINT_JOG = 0, TWIST = 1, POSE = 2
    assert SERVO_COMMAND_TYPES == {'joint_jog': 0, 'twist': 1, 'pose': 2}


def test_timeout_warning_rule():
    # Each command must stay fresh from its publication (latency after its image) until the
    # next one, one control period later.
    assert timeout_warning(0.5, 0.2, 0.2) is None
    assert timeout_warning(0.4, 0.2, 0.2) is None                 # exactly enough
    warning = timeout_warning(0.1, 0.05, 0.2)
    assert 'moveit_servo.incoming_command_timeout' in warning and '0.250' in warning
    assert timeout_warning(None, 0.05, 0.2) is None               # not read yet
    assert timeout_warning(0.1, None, 0.2) is None                # nothing measured yet
    assert timeout_warning(0.1, math.nan, 0.2) is None


def test_servo_names_resolve_in_the_node_namespace():
    assert fully_qualified('/servo_node', '/cell1') == '/servo_node'
    assert fully_qualified('servo_node', '/cell1') == '/cell1/servo_node'
    assert fully_qualified('servo_node', '/') == '/servo_node'


def test_a_new_servo_is_one_whose_server_the_type_was_not_selected_on():
    from vla_spec_ros.ros.servo_presence import request_topic, unselected

    assert request_topic('/arm/servo_node/switch_command_type') == \
        'rq/arm/servo_node/switch_command_typeRequest'
    old, new = b'old', b'new'
    assert unselected(frozenset({old}), None) == {old}              # never selected
    assert unselected(frozenset({old}), frozenset({old})) == set()
    # Killed and respawned: the dead one lingers beside the new one.
    assert unselected(frozenset({old, new}), frozenset({old})) == {new}
    assert unselected(frozenset({new}), frozenset({old, new})) == set()   # old expired


class _Client:
    """The part of an rclpy client a CallSlot uses, with real rclpy Futures; `answer(i)`
    completes the i-th call as the executor would."""

    def __init__(self):
        self.calls, self.removed = [], []

    def call_async(self, request):
        from rclpy.task import Future

        future = Future()
        self.calls.append((request, future))
        return future

    def remove_pending_request(self, future):
        self.removed.append(future)

    def answer(self, index, response='ok'):
        future = self.calls[index][1]
        if future not in self.removed:
            future.set_result(response)


@pytest.mark.skipif(not HAS_ROS, reason='needs rclpy')
def test_retried_calls_keep_earlier_ones_pending_and_any_answer_counts():
    from vla_spec_ros.ros.servo_calls import CallSlot

    client, answers = _Client(), []
    slot = CallSlot(client, retry_s=0.3, max_pending=2)
    assert slot.send('select', answers.append, now=0.0)
    assert not slot.send('select', answers.append, now=0.1)       # too soon
    assert slot.send('select', answers.append, now=0.3)           # unanswered: again
    assert slot.send('select', answers.append, now=0.6)           # the oldest given up
    assert client.removed == [client.calls[0][1]] and len(client.calls) == 3
    client.answer(0)                                               # given up: no callback
    assert answers == []
    client.answer(1)                                               # a later answer counts
    assert [f.result() for f in answers] == ['ok'] and slot.is_pending
    slot.clear()
    assert not slot.is_pending and client.calls[2][1] in client.removed


@pytest.mark.skipif(not HAS_ROS, reason='needs rclpy')
def test_an_expiring_call_is_one_at_a_time_and_given_up_after_its_time():
    from vla_spec_ros.ros.servo_calls import CallSlot

    client, answers = _Client(), []
    slot = CallSlot(client, retry_s=1.0)
    assert slot.send(True, answers.append, now=0.0)
    assert not slot.send(False, answers.append, now=5.0)          # one at a time
    assert not slot.expire(now=0.9)
    assert slot.expire(now=1.0) and not slot.is_pending           # a killed Servo's call
    client.answer(0)
    assert answers == []                                          # its late answer ignored
    assert slot.send(False, answers.append, now=1.0)
    client.answer(1, 'resumed')
    assert [f.result() for f in answers] == ['resumed'] and not slot.is_pending
    with pytest.raises(ValueError, match='max_pending'):
        CallSlot(client, 1.0, max_pending=0)


@pytest.mark.skipif(not HAS_ROS, reason='needs rclpy')
def test_an_answer_already_in_when_its_call_is_given_up_runs_no_callback():
    """The client had taken the answer, its callback queued for the executor and not yet run,
    when Servo went away (clear) or the call expired: removing the request from the client
    stops nothing then, so the slot must. Otherwise a gone Servo's late answer (its old
    timeout) lands after the new instance's."""
    from vla_spec_ros.ros.servo_calls import CallSlot

    class QueuedCallbacks(_Client):
        """Done callbacks queued, as an executor runs them: later, as tasks."""

        def __init__(self):
            super().__init__()
            self.queued = []

        def call_async(self, request):
            future = super().call_async(request)
            future.add_done_callback = self.queued.append
            return future

    for give_up in ('clear', 'expire'):
        client, answers = QueuedCallbacks(), []
        slot = CallSlot(client, retry_s=1.0)
        assert slot.send('read', answers.append, now=0.0)
        client.answer(0, 'old servo')                   # the answer is in ...
        slot.clear() if give_up == 'clear' else slot.expire(now=2.0)    # ... then given up
        for callback in client.queued:                  # the executor's turn
            callback(client.calls[0][1])
        assert answers == [] and not slot.is_pending, give_up
    # An answer whose call is still pending runs its callback.
    client, answers = QueuedCallbacks(), []
    slot = CallSlot(client, retry_s=1.0)
    slot.send('read', answers.append, now=0.0)
    client.answer(0, 'new servo')
    for callback in client.queued:
        callback(client.calls[0][1])
    assert [f.result() for f in answers] == ['new servo']


@pytest.mark.skipif(not HAS_ROS, reason='needs rclpy + ROS message wheels')
def test_without_moveit_msgs_the_contract_reports_why_and_calls_nothing(monkeypatch):
    import rclpy
    from diagnostic_msgs.msg import DiagnosticStatus
    from rclpy.node import Node

    from vla_spec_ros.ros.diagnostics import ERROR
    from vla_spec_ros.ros.servo_contract import ServoContract

    # The import fails, even where an earlier test of this process imported the built
    # interfaces (a cached submodule would otherwise be found before its package).
    for name in [m for m in sys.modules if m.startswith('moveit_msgs.')] + ['moveit_msgs']:
        monkeypatch.setitem(sys.modules, name, None)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    node = Node('servo_contract_without_moveit_msgs', context=context)
    try:
        contract = ServoContract(node, '/servo_node', 'twist', 'robot', pause_on_hold=True,
                                 measure=lambda: (None, 0.2))
        contract.set_active(True)
        contract.on_hold()
        assert 'moveit_msgs is not importable' in contract.error
        assert node.get_client_names_and_types_by_node(node.get_name(), '/') == []
        status = DiagnosticStatus(level=bytes([0]), message='publishing actions')
        contract.add_to_status(status)
        assert status.level == bytes([ERROR]) and 'moveit_msgs' in status.message
        contract.destroy()
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


# ---- over DDS -----------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def moveit_msgs():
    from ros_interfaces import forget_prefix, interface_prefix, use_prefix

    prefix = interface_prefix('moveit_msgs')
    use_prefix(prefix, 'moveit_msgs')
    yield prefix
    forget_prefix(prefix)


@pytest.fixture(scope='module')
def graph(moveit_msgs):
    if not (HAS_ROS and HAS_TORCH):
        pytest.skip('needs rclpy + ROS message wheels and torch')
    from ros_probe import ros_graph

    from vla_spec_ros import VLAPolicy

    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    with ros_graph(DOMAIN_ID, 'servo_probe', num_threads=2) as (context, executor, probe_node):
        yield policy, context, executor, probe_node


def start_node(graph, name, remaps, **changes):
    from rclpy.parameter import Parameter

    from ros_probe import Probe
    from vla_spec_ros.ros.node import VLASpecNode

    policy, context, executor, probe_node = graph
    overrides = {'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY, 'frame_id': 'base_link',
                 'max_linear_speed': 10.0, 'max_angular_speed': 20.0, 'max_action_age': 20.0,
                 'diagnostics_period': 0.2, **changes}
    cli_args = ['--ros-args'] + [a for own, to in remaps for a in ('-r', f'{own}:={to}')]
    node = VLASpecNode(policy, node_name=name, context=context, cli_args=cli_args,
                       parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    return node, Probe(probe_node, name)


def stop_node(graph, node):
    graph[2].remove_node(node)
    node.destroy_node()


def start_servo(graph, **kwargs):
    from servo_double import ServoDouble

    servo = ServoDouble(context=graph[1], **kwargs)
    graph[2].add_node(servo)
    return servo


def feed_until(probe, predicate, what, rng=np.random.default_rng(0)):
    """Publish fresh frames (a new stamp each, every 0.1 s) until `predicate()`."""
    from ros_probe import wait_until

    wait_until(lambda: probe.image_pub.get_subscription_count() > 0, what='image subscriber')
    image = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    deadline_checks = int(TIMEOUT / 0.1)
    for _ in range(deadline_checks):
        probe.image_pub.publish(probe.raw_image(image))
        try:
            return wait_until(predicate, timeout=0.1, what=what)
        except AssertionError:
            continue
    raise AssertionError(f'timed out waiting for {what}')


def verdicts(servo, start=0):
    return [verdict for _, _, _, verdict in servo.snapshot()[0][start:]]


@needs_ros
def test_a_servo_that_never_answers_the_selection_is_named_in_last_failure(graph):
    """A Servo whose switch_command_type is listed but never answers (hung): the robot holds
    (`selecting the twist command type`), and `servo_last_failure` says the selection went
    unanswered; before, it stayed empty, or named only the pause calls."""
    from moveit_msgs.srv import ServoCommandType
    from rclpy.node import Node

    from ros_probe import wait_until

    # Never spun: its services are in the graph, their requests never taken.
    hung = Node('hung_servo', context=graph[1])
    hung.create_service(ServoCommandType, '~/switch_command_type', lambda q, r: r)
    node, _ = start_node(graph, f'vla_hung_{next(RUNS)}', [], servo_node='/hung_servo',
                         servo_pause_on_hold=False, enabled=True)
    try:
        servo = node.serving.channels[0].servo
        wait_until(lambda: 'switch_command_type' in servo.diagnostic_values()[
            'servo_last_failure'], timeout=15.0,
            what='the unanswered selection in servo_last_failure')
        values = servo.diagnostic_values()
        assert values['servo_type_selected'] == 'false'
        assert 'unanswered' in values['servo_last_failure']
    finally:
        stop_node(graph, node)
        hung.destroy_node()


@needs_ros
def test_without_the_contract_servo_never_acts_on_the_twists(graph):
    from servo_double import EXECUTED
    from std_srvs.srv import SetBool

    servo = start_servo(graph, timeout_s=TIMEOUT)
    node, probe = start_node(graph, 'vla_no_servo', [('~/twist', '/servo_node/delta_twist_cmds')])
    try:
        assert probe.call(probe.enable_client, SetBool.Request(data=True)).success
        feed_until(probe, lambda: len([v for v in verdicts(servo) if v != 'paused']) >= 3,
                   'twists reaching the Servo double')
        assert EXECUTED not in verdicts(servo)
        assert set(verdicts(servo)) == {'no command type selected'}
        assert servo.snapshot()[1] == []          # nobody called its services
    finally:
        stop_node(graph, node)
        graph[2].remove_node(servo)
        servo.destroy_node()


@needs_ros
def test_the_node_selects_twist_pauses_on_a_hold_and_resumes_with_fresh_frames(graph):
    from diagnostic_msgs.msg import DiagnosticArray
    from ros_probe import Recorder, wait_until
    from servo_double import EXECUTED, TWIST
    from std_srvs.srv import SetBool

    # The node first, Servo later: nothing to select yet, the diagnostics say so.
    node, probe = start_node(graph, 'vla_servo', [('~/twist', '/servo_node/delta_twist_cmds')],
                             servo_node='/servo_node')
    diagnostics = Recorder(probe.node.get_clock())
    probe.node.create_subscription(DiagnosticArray, '/diagnostics', diagnostics, 10)

    def robot_status():
        for _, msg in reversed(diagnostics.snapshot()):
            for status in msg.status:
                if status.name.endswith('vla_servo: inference'):
                    return status
        return None

    def servo_value(status, key):
        return next(v.value for v in status.values if v.key == key)

    servo = None
    try:
        wait_until(lambda: robot_status() is not None
                   and 'waiting for /servo_node/switch_command_type'
                   in servo_value(robot_status(), 'servo_state'), what='waiting diagnostics')
        servo = start_servo(graph, timeout_s=TIMEOUT)
        wait_until(lambda: ('switch_command_type', TWIST, True) in servo.snapshot()[1],
                   what='the node selecting TWIST')
        commands, calls = servo.snapshot()
        assert calls[0] == ('switch_command_type', TWIST, True)
        # Disabled at start: its hold paused Servo once the service was there.
        wait_until(lambda: servo.paused, what='Servo paused while the node holds')

        # Enabled with fresh frames: Servo resumed, twists acted on.
        start = len(servo.snapshot()[0])
        assert probe.call(probe.enable_client, SetBool.Request(data=True)).success
        feed_until(probe, lambda: EXECUTED in verdicts(servo, start), 'an executed twist')
        assert not servo.paused
        commands, calls = servo.snapshot()
        resumed = max(i for i, call in enumerate(calls) if call == ('pause', False))
        assert calls.index(('switch_command_type', TWIST, True)) < resumed
        wait_until(lambda: servo_value(robot_status(), 'servo_state') == 'accepting twist',
                   what='diagnostics: accepting twist')
        status = robot_status()
        assert servo_value(status, 'servo_type_selected') == 'true'
        assert servo_value(status, 'servo_incoming_command_timeout_s') == f'{TIMEOUT:.3f}'

        # A hold (disable) pauses Servo: the zero twists after it are not acted on.
        start = len(servo.snapshot()[0])
        assert probe.call(probe.enable_client, SetBool.Request(data=False)).success
        wait_until(lambda: servo.paused, what='Servo paused on the hold')
        assert servo.snapshot()[1][-1] == ('pause', True)
        # Fresh frames after enabling again resume it.
        assert probe.call(probe.enable_client, SetBool.Request(data=True)).success
        start = len(servo.snapshot()[0])
        feed_until(probe, lambda: EXECUTED in verdicts(servo, start), 'an executed twist')
        assert servo.snapshot()[1][-1] == ('pause', False)

        # Servo resolves frame_id: a frame it does not know is refused.
        assert probe.set_param('frame_id', 'camera_optical').successful
        start = len(servo.snapshot()[0])
        feed_until(probe, lambda: "unknown frame 'camera_optical'" in verdicts(servo, start),
                   'a command in an unknown frame')
        assert probe.set_param('frame_id', 'base_link').successful

        # A Servo timeout below latency + one control period: WARN, naming the parameter.
        servo.set_parameters([_double('moveit_servo.incoming_command_timeout', 0.001)])
        wait_until(lambda: 'incoming_command_timeout 0.001' in servo_value(
            robot_status(), 'servo_state'), what='the timeout warning')
        status = robot_status()
        assert status.level == b'\x01' and 'servo:' in status.message
        # ... and Servo halts the node's commands, as the warning says.
        start = len(servo.snapshot()[0])
        feed_until(probe, lambda: 'stale command: halt' in verdicts(servo, start),
                   'a command Servo halts on')
    finally:
        stop_node(graph, node)
        if servo is not None:
            graph[2].remove_node(servo)
            servo.destroy_node()


def _double(name, value):
    from rclpy.parameter import Parameter

    return Parameter(name, value=float(value))


@needs_ros
def test_a_managed_node_selects_the_type_on_activate_and_pauses_on_deactivate(graph):
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState
    from rclpy.parameter import Parameter
    from ros_probe import Probe, wait_until
    from servo_double import TWIST

    from vla_spec_ros.ros.lifecycle_node import VLASpecLifecycleNode

    policy, context, executor, probe_node = graph
    servo = start_servo(graph, timeout_s=TIMEOUT)
    overrides = {'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'servo_node': '/servo_node', 'enabled': True, 'max_action_age': 20.0}
    name = f'vla_managed_servo_{next(RUNS)}'      # a fresh name for each run of this test
    node = VLASpecLifecycleNode(policy, node_name=name, context=context,
                                parameter_overrides=[Parameter(k, value=v)
                                                     for k, v in overrides.items()])
    executor.add_node(node)
    probe = Probe(probe_node, name)
    change = probe_node.create_client(ChangeState, f'/{name}/change_state')

    def transition(transition_id):
        return probe.call(change, ChangeState.Request(
            transition=Transition(id=transition_id))).success
    try:
        assert transition(Transition.TRANSITION_CONFIGURE)
        # Configured, not active: Servo is left alone.
        wait_until(lambda: node.serving is not None and node.serving.channels[0].servo
                   is not None and node.serving.channels[0].servo._servo_was_up,
                   what='the contract seeing Servo')
        assert servo.snapshot()[1] == []
        assert transition(Transition.TRANSITION_ACTIVATE)
        wait_until(lambda: ('switch_command_type', TWIST, True) in servo.snapshot()[1],
                   what='TWIST selected on activate')
        assert transition(Transition.TRANSITION_DEACTIVATE)
        wait_until(lambda: servo.paused, what='Servo paused on deactivate')
        assert servo.snapshot()[1][-1] == ('pause', True)
    finally:
        executor.remove_node(node)
        node.destroy_node()
        executor.remove_node(servo)
        servo.destroy_node()
