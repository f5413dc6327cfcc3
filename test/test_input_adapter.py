"""A robot's paired inputs (ros/input_adapter.py): one class each, one registration place
(`robot_io.build_inputs`), as outputs are.

Checked: `build_inputs` lists the state input of each `state_input` choice; and a new input,
written here as one InputAdapter subclass (a gate that must be open before the robot moves)
and registered with one line, is subscribed, read at each observation's time and obeyed by
the real node over DDS: no gate message yet holds the robot (stale), a closed gate refuses the
frame (bad input), an open gate lets actions out; its /diagnostics value is in the robot's
status; its subscription goes with the node.
"""
import importlib.util
import os
import threading

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy + ROS message wheels')

if HAS_ROS:
    import rclpy
    from diagnostic_msgs.msg import KeyValue
    from rclpy.node import Node
    from rclpy.parameter import Parameter
    from std_msgs.msg import Bool

    from ros_probe import Probe, ros_graph, wait_until
    from vla_spec_ros.ros import command_rules as cmd
    from vla_spec_ros.ros import params, robot_channel, robot_io
    from vla_spec_ros.ros.input_adapter import InputAdapter
    from vla_spec_ros.ros.qos import IMAGE_QOS
    from vla_spec_ros.ros.state_input import ArrayStateInput, JointStateInput

DOMAIN_ID = 181 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'


def _settings(**values):
    return params.configuration_from_parameters(values).node


def test_build_inputs_lists_the_state_input_of_each_choice():
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID)
    node = Node('inputs_listed', context=context)
    try:
        get = (lambda: None)
        assert robot_io.build_inputs(node, '~/', _settings(), get) == []
        [joint] = robot_io.build_inputs(
            node, '~/', _settings(state_input='joint_state', joint_names=['a', 'b']), get)
        [array] = robot_io.build_inputs(node, 'left/', _settings(state_input='array'), get)
        assert type(joint) is JointStateInput and type(array) is ArrayStateInput
        assert joint.key == array.key == 'state'
        assert joint._sub.topic_name == '/inputs_listed/joint_states'
        assert array._sub.topic_name == '/left/state'
        for adapter in (joint, array):
            adapter.destroy()
        assert node.get_subscriptions_info_by_topic('/left/state') == []
    finally:
        node.destroy_node()
        rclpy.shutdown(context=context)


class GateInput(InputAdapter):
    """A new input, as a contributor writes one: std_msgs/Bool on <prefix>gate; the robot may
    move only while the newest gate message says open."""

    key = 'gate'

    def __init__(self, node, prefix: str):
        self.node = node
        self.is_open = None               # None until the first message
        self._lock = threading.Lock()
        self._sub = node.create_subscription(Bool, prefix + 'gate', self._on_gate, IMAGE_QOS)

    def _on_gate(self, msg) -> None:
        with self._lock:
            self.is_open = bool(msg.data)

    def read_at(self, time_s, settings):
        with self._lock:
            is_open = self.is_open
        if is_open is None:
            return None, (f'{cmd.REASON_STALE}: no gate message yet', False)
        if not is_open:
            return None, (f'{cmd.REASON_BAD_INPUT}: the gate is closed', True)
        return True, None

    def add_to_status(self, status) -> None:
        words = {None: 'unknown', True: 'open', False: 'closed'}
        status.values.append(KeyValue(key='gate', value=words[self.is_open]))

    def destroy(self) -> None:
        self.node.destroy_subscription(self._sub)


@pytest.mark.skipif(not HAS_TORCH, reason='needs torch')
def test_a_new_input_is_one_class_and_one_registration_line(monkeypatch):
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.node import VLASpecNode

    listed = robot_io.build_inputs
    # The registration line (in robot_io.build_inputs, for a shipped input).
    monkeypatch.setattr(robot_channel, 'build_inputs', lambda node, prefix, settings, get:
                        listed(node, prefix, settings, get) + [GateInput(node, prefix)])
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': 'bridge_orig',
                 'max_action_age': 5.0, 'max_linear_speed': 10.0, 'max_angular_speed': 20.0}
    rng = np.random.default_rng(0)
    with ros_graph(DOMAIN_ID, 'gate_probe', num_threads=2) as (context, executor, probe_node):
        node = VLASpecNode(policy, node_name='vla_gate', context=context, parameter_overrides=[
            Parameter(k, value=v) for k, v in overrides.items()])
        executor.add_node(node)
        try:
            probe = Probe(probe_node, 'vla_gate')
            gate_pub = probe_node.create_publisher(Bool, '/vla_gate/gate', IMAGE_QOS)
            channel = node.serving.channels[0]
            gate = channel.observation.input('gate')
            assert isinstance(gate, GateInput)

            def image():
                return probe.raw_image(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))

            def snapshot():
                return node.stats_snapshot()

            # No gate message yet: the frame is held as stale input, nothing acted on.
            probe.send(image(), until=lambda: snapshot()['hold_reason'].startswith(
                f'{cmd.REASON_STALE}: no gate message yet'))
            assert snapshot()['actions_published'] == 0
            # Closed: refused as bad input (an error), still no action.
            wait_until(lambda: gate_pub.get_subscription_count() > 0, what='gate subscriber')
            gate_pub.publish(Bool(data=False))
            wait_until(lambda: gate.is_open is False, what='gate closed')
            probe.send(image(), until=lambda: 'the gate is closed' in snapshot()['last_error'],
                       restamp=True)
            assert snapshot()['actions_published'] == 0
            # Open: the images are answered.
            gate_pub.publish(Bool(data=True))
            wait_until(lambda: gate.is_open is True, what='gate open')
            start = len(probe.actions.snapshot())
            probe.send(image(), until=lambda: len(probe.actions.snapshot()) > start,
                       restamp=True)
            assert snapshot()['actions_published'] >= 1
            status = channel.diagnostic(node.serving.engine.config.mode)
            assert {v.key: v.value for v in status.values}['gate'] == 'open'
        finally:
            executor.remove_node(node)
            node.destroy_node()
        wait_until(lambda: gate_pub.get_subscription_count() == 0, what='gate unsubscribed')
