"""Node settings a checkpoint recommends (ros/recommended_settings.py): taken where the user set
none, node-wide and per robot, logged either way; a recommendation the node cannot take is an
error naming the file. The embedded FAST model recommends chunk_blend ensemble (its measured
best blend); over DDS the real node takes it, unless the parameter is given."""
import importlib.util
import json
import os

import pytest

HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
pytestmark = pytest.mark.skipif(not HAS_ROS, reason='needs rclpy + ROS message wheels')

DOMAIN_ID = 71 + (os.getpid() % 20)


def test_a_checkpoints_file_and_its_familys_recommendations(tmp_path):
    from vla_spec_ros.models import registry
    from vla_spec_ros.ros.recommended_settings import checkpoint_recommendations

    folder = tmp_path / 'ckpt'
    registry.make_checkpoint('tiny', folder, seed=0)
    assert checkpoint_recommendations(folder)[0] == {}          # OpenVLA recommends nothing
    (folder / 'vla_spec_node.json').write_text(json.dumps(
        {'recommended': {'chunk_blend': 'ensemble', 'chunk_ensemble_decay': 0.25}}))
    recommended, source = checkpoint_recommendations(folder)
    assert recommended == {'chunk_blend': 'ensemble', 'chunk_ensemble_decay': 0.25}
    assert source.endswith('vla_spec_node.json')
    from vla_spec_ros.assets import embedded_checkpoint
    embedded = embedded_checkpoint('metaworld-demo-fast')
    if embedded is not None:            # measured best with the ensemble blend (docs/demo.md)
        recommended, source = checkpoint_recommendations(embedded)
        assert recommended == {'chunk_blend': 'ensemble'}
        assert source.endswith('vla_spec_node.json')
    fast = registry.make_checkpoint('pi0fast-tiny', tmp_path / 'fast', seed=0)
    assert checkpoint_recommendations(fast) == ({'chunk_blend': 'ensemble'}, 'its model family')


@pytest.mark.parametrize('recommended, words', [
    ({'chunk_blend': 'sometimes'}, 'chunk_blend'),
    ({'no_such_parameter': 1}, 'not a node parameter'),
    ({'mode': 'ar'}, 'not a node parameter'),                   # an engine option: never
])
def test_a_recommendation_the_node_cannot_take_names_the_file(tmp_path, recommended, words):
    from vla_spec_ros.ros.recommended_settings import checkpoint_recommendations

    (tmp_path / 'vla_spec_node.json').write_text(json.dumps({'recommended': recommended}))
    with pytest.raises(ValueError, match=words) as info:
        checkpoint_recommendations(tmp_path)
    assert 'vla_spec_node.json' in str(info.value)


@pytest.fixture(scope='module')
def ros():
    from ros_probe import ros_graph
    with ros_graph(DOMAIN_ID, 'recommend_probe') as graph:
        yield graph


def start_node(ros, overrides, name):
    from rclpy.parameter import Parameter
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from rcl_interfaces.msg import Log
    from ros_probe import Recorder

    from vla_spec_ros.ros.node import VLASpecNode

    context, executor, probe_node = ros
    log = Recorder(probe_node.get_clock())
    probe_node.create_subscription(Log, '/rosout', log, QoSProfile(
        depth=1000, reliability=ReliabilityPolicy.RELIABLE,
        durability=DurabilityPolicy.TRANSIENT_LOCAL))
    node = VLASpecNode(context=context, node_name=name, parameter_overrides=[
        Parameter(k, value=v) for k, v in overrides.items()])
    executor.add_node(node)
    return node, log


def test_the_node_takes_the_embedded_fast_models_blend_unless_it_is_set(ros):
    from ros_probe import wait_until

    from vla_spec_ros.assets import embedded_checkpoint

    if embedded_checkpoint('metaworld-demo-fast') is None:
        pytest.skip('metaworld-demo-fast is not shipped in this tree')
    base = {'model_path': 'metaworld-demo-fast', 'robots': ['a', 'b']}
    node, log = start_node(ros, {**base, 'b.chunk_blend': 'latest'}, 'vla_recommended')
    try:
        value = node.get_parameter
        assert value('chunk_blend').value == 'ensemble'
        assert value('a.chunk_blend').value == 'ensemble'
        assert value('b.chunk_blend').value == 'latest'                   # set by the user
        assert node.serving.config.robots['a'].chunk_blend == 'ensemble'
        assert node.serving.config.robots['b'].chunk_blend == 'latest'
        wait_until(lambda: log.find(lambda m: m.name == 'vla_recommended' and
                                    'recommended by the checkpoint' in m.msg),
                   what='the recommendation in the log')
    finally:
        ros[1].remove_node(node)
        node.destroy_node()
    node, log = start_node(ros, {**base, 'chunk_blend': 'latest'}, 'vla_user_blend')
    try:
        assert node.get_parameter('chunk_blend').value == 'latest'
        assert node.get_parameter('a.chunk_blend').value == 'latest'
        wait_until(lambda: log.find(lambda m: m.name == 'vla_user_blend' and
                                    "'latest' as set" in m.msg),
                   what='the user\'s value in the log')
    finally:
        ros[1].remove_node(node)
        node.destroy_node()


def test_the_shipped_params_file_leaves_the_blend_to_the_checkpoint(ros):
    """config/robot.yaml (what robot.launch.py and sim.launch.py load) sets no chunk_blend, so
    the embedded FAST model's ensemble applies; the file's values are passed as a params file
    passes them, as overrides."""
    import pathlib

    import yaml

    from vla_spec_ros.assets import embedded_checkpoint

    if embedded_checkpoint('metaworld-demo-fast') is None:
        pytest.skip('metaworld-demo-fast is not shipped in this tree')
    path = pathlib.Path(__file__).resolve().parent.parent / 'config' / 'robot.yaml'
    values = yaml.safe_load(path.read_text())['/**']['ros__parameters']
    overrides = {k: v for k, v in values.items() if v != []}      # rclpy: [] is "not set"
    overrides['model_path'] = 'metaworld-demo-fast'
    node, _ = start_node(ros, overrides, 'vla_params_file')
    try:
        assert node.get_parameter('chunk_blend').value == 'ensemble'
        assert node.serving.config.robots[next(iter(node.serving.config.robots))] \
            .chunk_blend == 'ensemble'
    finally:
        ros[1].remove_node(node)
        node.destroy_node()


def test_a_value_set_on_a_managed_node_before_configure_is_the_users(ros):
    """`ros2 param set chunk_blend latest` on an unconfigured managed node, then configure:
    before, the checkpoint's recommendation overwrote it (and the log said "set chunk_blend
    to override"). A value set before configure is the user's, as a start-up one is."""
    from rclpy.parameter import Parameter

    from ros_probe import LogProbe
    from vla_spec_ros.assets import embedded_checkpoint
    from vla_spec_ros.ros.lifecycle_node import VLASpecLifecycleNode

    if embedded_checkpoint('metaworld-demo-fast') is None:
        pytest.skip('metaworld-demo-fast is not shipped in this tree')
    context, executor, probe_node = ros
    log = LogProbe(probe_node, 'vla_managed_blend')
    node = VLASpecLifecycleNode(node_name='vla_managed_blend', context=context,
                                parameter_overrides=[Parameter('model_path',
                                                               value='metaworld-demo-fast')])
    executor.add_node(node)
    try:
        assert node.set_parameters([Parameter('chunk_blend', value='latest')])[0].successful
        node.trigger_configure()
        assert node.serving is not None
        assert node.get_parameter('chunk_blend').value == 'latest'
        assert node.serving.config.robots[''].chunk_blend == 'latest'
        log.wait_for("'latest' as set")
    finally:
        executor.remove_node(node)
        node.destroy_node()
