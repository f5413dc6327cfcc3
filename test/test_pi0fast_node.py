"""A π0-FAST checkpoint behind the real node with one camera and no state topic (its family's
default state fills in), over DDS: the node's chunk steps carry the chunk ``predict`` decides
for the same image and instruction, on the embedded π0-FAST model (chunks of 8 steps x 7)."""
import importlib.util
import os

import numpy as np
import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy + ROS message wheels and torch')

DOMAIN_ID = 211 + (os.getpid() % 20)
MODEL = 'metaworld-demo-fast'
INSTRUCTION = 'open the drawer'


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'pi0fast_probe') as graph:
        yield graph


def test_a_fast_chunk_reaches_the_robot_through_the_node(ros):
    from rclpy.parameter import Parameter
    from ros_probe import Probe, wait_until

    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.assets import embedded_checkpoint
    from vla_spec_ros.ros.node import VLASpecNode

    if embedded_checkpoint(MODEL) is None:
        pytest.skip(f'{MODEL} is not shipped in this tree')
    reference = VLAPolicy.from_pretrained(MODEL, mode='ar')
    key = reference.unnorm_keys[0]
    size = reference.model_config.image_size
    rng = np.random.default_rng(3)
    image = None
    for _ in range(20):      # an image whose chunk decodes (the small model misses some)
        candidate = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        result = reference.predict(candidate, INSTRUCTION, key)
        if result.is_valid:
            image, expected = candidate, result.action
            break
    assert image is not None, 'no valid chunk in 20 random images'
    assert expected.ndim == 2 and expected.shape[1] == 7          # (steps, 7)
    context, executor, probe_node = ros
    overrides = {'model_path': MODEL, 'enabled': True, 'instruction': INSTRUCTION,
                 'unnorm_key': key, 'max_action_age': 30.0, 'control_period': 0.5,
                 'max_linear_speed': 10.0, 'max_angular_speed': 10.0}
    node = VLASpecNode(context=context, node_name='vla_fast', parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    try:
        probe = Probe(probe_node, 'vla_fast')
        assert node.serving.engine.config.mode == 'pipeline_spec'      # the default mode

        def step_of_the_chunk():
            return any(np.allclose(m.data, row, rtol=0, atol=1e-9)
                       for _, m in probe.actions.snapshot() for row in expected)
        probe.send(probe.raw_image(image), step_of_the_chunk, restamp=True)
        assert node.stats_snapshot()['actions_published'] >= 1
        wait_until(lambda: node.stats_snapshot()['chunk_steps_published'] >= 1,
                   what='a chunk step on the control clock')
    finally:
        executor.remove_node(node)
        node.destroy_node()
