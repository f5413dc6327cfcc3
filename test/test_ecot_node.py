"""A reasoning policy (ECoT, random weights in its layout) behind the real node over DDS: every
answered frame's reasoning on ~/reasoning (JSON, the image's stamp), the twist of its action,
and a frame with no action within max_reasoning_tokens refused with zero motion while its
reasoning still goes out; /diagnostics carries tokens and forwards per step."""
import importlib.util
import json
import os

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')

DOMAIN_ID = 201 + (os.getpid() % 10)
INSTRUCTION = 'put the cup on the plate'


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'ecot_probe') as graph:
        yield graph


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    from vla_spec_ros.models import registry
    root = tmp_path_factory.mktemp('ecot_node')
    return {'scripted': registry.make_checkpoint('ecot-tiny', root / 's', seed=0,
                                                 scripted_reasoning=True),
            'random': registry.make_checkpoint('ecot-tiny', root / 'r', seed=0)}


def start(ros, folder, name, **extra):
    from rclpy.parameter import Parameter
    from ros_probe import Probe, Recorder
    from std_msgs.msg import String

    from vla_spec_ros.ros.node import VLASpecNode

    context, executor, probe_node = ros
    overrides = {'model_path': str(folder), 'enabled': True, 'instruction': INSTRUCTION,
                 'unnorm_key': 'bridge_orig', 'max_action_age': 30.0, 'control_period': 0.2,
                 'max_linear_speed': 10.0, 'max_angular_speed': 20.0, **extra}
    node = VLASpecNode(context=context, node_name=name, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    probe = Probe(probe_node, name)
    reasoning = Recorder(probe_node.get_clock())
    probe_node.create_subscription(String, f'/{name}/reasoning', reasoning, 10)
    from diagnostic_msgs.msg import DiagnosticArray
    probe.diagnostic_arrays = Recorder(probe_node.get_clock())
    probe_node.create_subscription(DiagnosticArray, '/diagnostics', probe.diagnostic_arrays, 10)
    return node, probe, reasoning


def stop(ros, node):
    ros[1].remove_node(node)
    node.destroy_node()


def test_the_reasoning_and_its_action_reach_the_robot(ros, folders):
    from ros_probe import is_zero, wait_until

    from vla_spec_ros import VLAPolicy

    image = np.random.default_rng(1).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    expected = VLAPolicy.from_pretrained(str(folders['scripted']), mode='ar').predict(
        image, INSTRUCTION, 'bridge_orig')
    assert expected.is_valid
    node, probe, reasoning = start(ros, folders['scripted'], 'vla_ecot')
    try:
        msg = probe.raw_image(image)

        def answered():
            return reasoning.find(lambda m: json.loads(m.data)['stamp'] == {
                'sec': msg.header.stamp.sec, 'nanosec': msg.header.stamp.nanosec})
        _, out = probe.send(msg, answered, restamp=True)
        data = json.loads(out.data)
        assert data['text'] == expected.reasoning.text
        assert data['fields'] == expected.reasoning.fields
        assert data['num_tokens'] == len(expected.tokens) and data['action_valid'] is True
        assert data['forward_passes'] >= 1
        _, twist = probe.twists.wait_for(lambda m: m.header.stamp == msg.header.stamp,
                                         what='the twist of the reasoned frame')
        assert not is_zero(twist)
        wait_until(lambda: any(v.key == 'reasoning_tokens' for v in _status_values(probe)),
                   what='reasoning_tokens in /diagnostics')
    finally:
        stop(ros, node)


def test_no_action_within_the_budget_holds_and_still_says_why(ros, folders):
    from ros_probe import is_zero, wait_until

    node, probe, reasoning = start(ros, folders['random'], 'vla_ecot_budget',
                                   max_reasoning_tokens=24)
    try:
        image = np.random.default_rng(2).integers(0, 256, (48, 64, 3), dtype=np.uint8)
        msg = probe.raw_image(image)
        _, out = probe.send(msg, lambda: reasoning.find(lambda m: True), restamp=True)
        data = json.loads(out.data)
        assert data['action_valid'] is False
        assert data['invalid_reason'] == 'no action within max_reasoning_tokens 24'
        assert data['num_tokens'] == 24 + 1 + 1 + 7
        wait_until(lambda: 'no action within' in (node.stats_snapshot()['hold_reason'] or ''),
                   what='the hold with the reason')
        assert all(is_zero(m) for _, m in probe.twists.snapshot())
    finally:
        stop(ros, node)


def test_reasoning_every_n_set_at_run_time_reuses_the_text(ros, folders):
    """``ros2 param set reasoning_every_n 3`` (a tunable): the next frames of the robot say
    ``reasoning_reused`` true after a fresh one, with the fresh frame's text."""
    from rclpy.parameter import Parameter
    from ros_probe import wait_until

    node, probe, reasoning = start(ros, folders['scripted'], 'vla_ecot_every_n')
    try:
        result = node.set_parameters([Parameter('reasoning_every_n', value=3)])
        assert result[0].successful, result[0].reason
        rng = np.random.default_rng(3)
        for _ in range(4):
            msg = probe.raw_image(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
            stamp = {'sec': msg.header.stamp.sec, 'nanosec': msg.header.stamp.nanosec}
            probe.send(msg, lambda: reasoning.find(
                lambda m: json.loads(m.data)['stamp'] == stamp), restamp=True)
        published = [json.loads(m.data) for _, m in reasoning.snapshot()]
        fresh = [d for d in published if not d['reasoning_reused']]
        reused = [d for d in published if d['reasoning_reused']]
        assert fresh and reused
        assert all(d['text'] == fresh[0]['text'] for d in reused)
        # A reused text was not generated for its frame: only the action's tokens count.
        assert all(d['num_tokens'] < fresh[0]['num_tokens'] for d in reused)
        wait_until(lambda: node.get_parameter('reasoning_every_n').value == 3,
                   what='the parameter kept')
    finally:
        stop(ros, node)


def test_a_kept_reasoning_is_not_reused_after_a_new_instruction_or_a_pause(ros, folders):
    """reasoning_every_n 4: before, the frames after a new instruction acted on the old
    task's reasoning (the kept text knew no instruction), after ``enabled`` false then true
    on the reasoning from before the pause, and after a switch A -> B -> A on A's text from
    before the switch. Now the first frame after each reasons afresh."""
    from rclpy.parameter import Parameter

    node, probe, reasoning = start(ros, folders['scripted'], 'vla_ecot_stale_reuse',
                                   reasoning_every_n=4)
    rng = np.random.default_rng(5)

    def answer():
        msg = probe.raw_image(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))
        stamp = {'sec': msg.header.stamp.sec, 'nanosec': msg.header.stamp.nanosec}
        found = probe.send(msg, lambda: reasoning.find(
            lambda m: json.loads(m.data)['stamp'] == stamp), restamp=True)
        return json.loads(found[1].data)

    def set_parameter(name, value):
        result = node.set_parameters([Parameter(name, value=value)])[0]
        assert result.successful, result.reason

    try:
        assert not answer()['reasoning_reused']
        assert answer()['reasoning_reused']                 # the kept text, as configured
        set_parameter('instruction', 'put the cup in the sink')
        assert not answer()['reasoning_reused']             # a new task reasons afresh
        assert answer()['reasoning_reused']
        set_parameter('enabled', False)
        set_parameter('enabled', True)
        assert not answer()['reasoning_reused']             # after a pause, afresh
        # A -> B -> A: the text kept under A before the switch is not A's any more (the
        # scene moved on; before, the first frame after the switch back reused it).
        assert answer()['reasoning_reused']
        set_parameter('instruction', 'wipe the table')
        set_parameter('instruction', 'put the cup in the sink')
        assert not answer()['reasoning_reused']
    finally:
        stop(ros, node)


def _status_values(probe):
    statuses = [s for _, m in probe.diagnostic_arrays.snapshot() for s in m.status]
    return [v for s in statuses for v in s.values]
