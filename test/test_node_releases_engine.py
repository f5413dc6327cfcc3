"""A stopped node leaves its policy's engine idle; ``predict`` on a busy engine says who holds it.

The failure this guards against: a program (the demo's realtime rows, a closed-loop run) stops a
node while a frame it submitted is still in the engine, then reuses the same ``VLAPolicy``; its
``predict`` found the engine busy, or, worse, a later node would have stepped the dead node's
frame. Whether a frame is still in flight at the moment of ``destroy_node`` depended on the
machine's speed; here it is made certain: the engine runs one real step (the frame's prefill)
and later steps do nothing, so the frame is in flight (one step done of its seven) when the node
is destroyed.

Real rclpy node over DDS (a probe publishes the camera frame); the engine is the real one.
"""
import importlib.util
import os
import time

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs',
                        'lifecycle_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason='needs torch')
needs_ros = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                               reason='needs rclpy + ROS message wheels and torch')

if HAS_ROS and HAS_TORCH:
    from rclpy.lifecycle import TransitionCallbackReturn
    from rclpy.parameter import Parameter

    from ros_probe import Probe, ros_graph
    from vla_spec_ros.ros.lifecycle_node import VLASpecLifecycleNode
    from vla_spec_ros.ros.node import VLASpecNode

DOMAIN_ID = 121 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
UNNORM_KEY = 'bridge_orig'
SUCCESS = TransitionCallbackReturn.SUCCESS if HAS_ROS and HAS_TORCH else None


def _image(seed=3):
    return np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)


@pytest.fixture(scope='module')
def policy():
    from vla_spec_ros import VLAPolicy

    return VLAPolicy.from_pretrained('tiny', mode='pipeline', restrict_to_action_tokens=True)


@pytest.fixture(scope='module')
def expected(policy):
    """The action ``predict`` gives for the test image on an idle engine."""
    assert not policy.engine.has_work()
    return policy.predict(_image(), INSTRUCTION, UNNORM_KEY).action


@pytest.fixture(scope='module')
def ros():
    with ros_graph(DOMAIN_ID, 'release_probe') as graph:
        yield graph


class StepBudget:
    """The first ``num_real_steps`` calls of ``engine.step`` step the engine; later calls do
    nothing (return no finished action), so a frame admitted by those steps stays in flight
    however long the node then takes to stop, on any machine. ``remove()`` restores the
    engine's own step."""

    def __init__(self, engine, num_real_steps: int):
        self.engine = engine
        self.num_left = num_real_steps
        self._real_step = engine.step
        engine.step = self._step

    def _step(self):
        if self.num_left > 0:
            self.num_left -= 1
            return self._real_step()
        time.sleep(0.001)            # the worker loops while the engine has work: no busy spin
        return []

    def remove(self):
        del self.engine.step


def _hold_a_frame_in_flight(node, probe, policy):
    """The node's frame admitted (its prefill step run) and not finished: one real step."""
    budget = StepBudget(policy.engine, num_real_steps=1)
    probe.send(probe.raw_image(_image()), lambda: policy.engine.num_inflight == 1
               and budget.num_left == 0, restamp=True)
    assert policy.engine.has_work(), 'the frame should still be in the engine'
    return budget


def _node(policy, context, node_class, name):
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': UNNORM_KEY,
                 'max_action_age': 60.0, 'max_linear_speed': 10.0, 'max_angular_speed': 20.0}
    return node_class(policy, node_name=name, context=context,
                      parameter_overrides=[Parameter(k, value=v) for k, v in overrides.items()])


@needs_ros
def test_destroying_a_node_with_a_frame_in_flight_leaves_the_engine_idle(
        ros, policy, expected):
    context, executor, probe_node = ros
    node = _node(policy, context, VLASpecNode, 'vla_release')
    executor.add_node(node)
    probe = Probe(probe_node, 'vla_release')
    budget = None
    try:
        budget = _hold_a_frame_in_flight(node, probe, policy)
        assert policy.engine.busy_streams == (node.serving.channels[0].stream_id,)
    finally:
        executor.remove_node(node)
        node.destroy_node()
        if budget is not None:
            budget.remove()
    assert not policy.engine.has_work()
    assert policy.engine.busy_streams == ()
    # The same policy predicts as on an idle engine (no leftover of the node's frame).
    np.testing.assert_array_equal(policy.predict(_image(), INSTRUCTION, UNNORM_KEY).action,
                                  expected)


@needs_ros
def test_deactivating_a_managed_node_releases_its_frames(ros, policy, expected):
    context, executor, probe_node = ros
    node = _node(policy, context, VLASpecLifecycleNode, 'vla_release_managed')
    executor.add_node(node)
    probe = Probe(probe_node, 'vla_release_managed')
    budget = None
    try:
        assert node.trigger_configure() == SUCCESS
        assert node.trigger_activate() == SUCCESS
        budget = _hold_a_frame_in_flight(node, probe, policy)
        assert node.trigger_deactivate() == SUCCESS
        assert not policy.engine.has_work()     # the node's worker still runs, idle now
    finally:
        executor.remove_node(node)
        node.destroy_node()
        if budget is not None:
            budget.remove()
    assert not policy.engine.has_work()
    np.testing.assert_array_equal(policy.predict(_image(), INSTRUCTION, UNNORM_KEY).action,
                                  expected)


@needs_torch
def test_predict_on_a_busy_engine_names_the_streams_and_works_after_a_reset(policy, expected):
    from vla_spec_ros.engine.result import Frame

    engine = policy.engine
    engine.submit(Frame(_image(), INSTRUCTION, UNNORM_KEY, 'left_arm'))
    engine.step()                            # admitted: in flight, not finished
    assert engine.has_work()
    with pytest.raises(RuntimeError, match=r"idle engine; streams \['left_arm'\]"):
        policy.predict(_image(), INSTRUCTION, UNNORM_KEY)
    assert engine.busy_streams == ('left_arm',)       # the refused predict left it as it was
    engine.reset('left_arm')
    np.testing.assert_array_equal(policy.predict(_image(), INSTRUCTION, UNNORM_KEY).action,
                                  expected)
