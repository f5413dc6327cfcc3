"""Integration: the managed `vla_spec` node driven through the standard lifecycle services over
real DDS (lifecycle_msgs ChangeState / GetState, as `ros2 lifecycle set` calls them).

Checked: nothing is published before activate (not even zero twists); activate acts on frames;
deactivate publishes a zero twist and stops acting; cleanup frees the model; a configure whose
model does not load fails with the reason and leaves the node unconfigured and silent; `~/enable`
and the `enabled` parameter are one switch in every state: set while inactive, both are
accepted and kept, nothing is published until activate, which then acts without another enable.
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
pytestmark = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                                reason='needs rclpy, lifecycle_msgs + ROS message wheels, torch')

if HAS_ROS and HAS_TORCH:
    from lifecycle_msgs.msg import State, Transition
    from lifecycle_msgs.srv import ChangeState, GetState
    from rclpy.parameter import Parameter

    from ros_probe import Probe, ros_graph, is_zero, wait_until
    from vla_spec_ros.ros.lifecycle_node import VLASpecLifecycleNode

DOMAIN_ID = 171 + (os.getpid() % 40)
INSTRUCTION = 'put the red block in the drawer'
QUIET_S = 0.6          # how long "nothing is published" is watched for


@pytest.fixture(scope='module')
def ros():
    with ros_graph(DOMAIN_ID, 'lifecycle_probe', num_threads=2) as graph:
        yield graph


class Lifecycle:
    """ChangeState / GetState clients of one managed node."""

    def __init__(self, probe: Probe, node_name: str):
        self.probe = probe
        self.change = probe.node.create_client(ChangeState, f'/{node_name}/change_state')
        self.get = probe.node.create_client(GetState, f'/{node_name}/get_state')

    def transition(self, transition_id) -> bool:
        return self.probe.call(self.change, ChangeState.Request(
            transition=Transition(id=transition_id))).success

    def state(self) -> int:
        return self.probe.call(self.get, GetState.Request()).current_state.id


def _frame(rng):
    return rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)


def _quiet(probe, start):
    """Publish frames for QUIET_S; the number of twists received meanwhile."""
    rng = np.random.default_rng(0)
    deadline = time.monotonic() + QUIET_S
    while time.monotonic() < deadline:
        probe.image_pub.publish(probe.raw_image(_frame(rng)))
        time.sleep(0.05)
    return len(probe.twists.snapshot()) - start


def _recording_node(ros, name, record_dir):
    """A managed node over the tiny model, enabled with an instruction, recording every
    frame it acts on to `record_dir`, added to the test's executor (unconfigured)."""
    from vla_spec_ros import VLAPolicy

    context, executor, _ = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    overrides = {'enabled': True, 'instruction': INSTRUCTION, 'unnorm_key': 'bridge_orig',
                 'max_action_age': 5.0, 'max_linear_speed': 10.0, 'max_angular_speed': 20.0,
                 'record_dir': str(record_dir), 'record_period': 0.0}
    node = VLASpecLifecycleNode(policy, node_name=name, context=context,
                                parameter_overrides=[Parameter(k, value=v)
                                                     for k, v in overrides.items()])
    executor.add_node(node)
    return node


def test_transitions_gate_everything_the_node_publishes(ros, tmp_path):
    context, executor, probe_node = ros
    node = _recording_node(ros, 'vla_managed', tmp_path / 'recorded')
    try:
        probe = Probe(probe_node, 'vla_managed')
        life = Lifecycle(probe, 'vla_managed')
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert node.serving is None
        # Unconfigured: no topics exist yet, so nothing can be published.
        assert _quiet(probe, 0) == 0

        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_INACTIVE
        wait_until(lambda: probe.image_pub.get_subscription_count() > 0, what='subscription')
        assert _quiet(probe, 0) == 0                 # inactive: not even zero twists
        assert node.serving.stats_snapshot()['actions_published'] == 0
        # /diagnostics says so (not OK, "publishing actions")
        from vla_spec_ros.ros.serving import INACTIVE_REASON
        status = node.serving.channels[0].diagnostic('pipeline_spec')
        assert status.message == INACTIVE_REASON and status.level != bytes([0])

        assert life.transition(Transition.TRANSITION_ACTIVATE)
        assert life.state() == State.PRIMARY_STATE_ACTIVE
        assert node.serving.stats_snapshot()['hold_reason'] != INACTIVE_REASON
        image = probe.raw_image(_frame(np.random.default_rng(1)))
        twist = probe.send(image, lambda: probe.twists.find(
            lambda m: m.header.stamp == image.header.stamp))[1]
        assert not is_zero(twist)

        start = len(probe.twists.snapshot())
        assert life.transition(Transition.TRANSITION_DEACTIVATE)
        zero = wait_until(lambda: probe.twists.find(is_zero, start), what='zero twist')
        assert is_zero(zero[1])
        after_zero = len(probe.twists.snapshot())
        assert _quiet(probe, after_zero) == 0        # deactivated: frames are not acted on
        assert not node.serving.engine.has_work()

        assert life.transition(Transition.TRANSITION_CLEANUP)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert node.serving is None
        # Cleanup closed the recording: a readable bag of the frames the engine acted on.
        _check_recording(tmp_path / 'recorded', image)
        # Reconfigurable: configure + activate again serves frames again.
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.transition(Transition.TRANSITION_ACTIVATE)
        image = probe.raw_image(_frame(np.random.default_rng(2)))
        probe.send(image, lambda: probe.twists.find(
            lambda m: m.header.stamp == image.header.stamp))
    finally:
        executor.remove_node(node)
        node.destroy_node()


def _check_recording(folder, last_image):
    from vla_spec_ros.image_messages import image_to_rgb
    from vla_spec_ros.train.bag_frames import BagFrames

    (bag,) = sorted(folder.iterdir())
    pairs = list(BagFrames(bag, '/camera/image', '/instruction'))
    assert pairs and all(text == INSTRUCTION for _, text in pairs)
    np.testing.assert_array_equal(pairs[-1][0], image_to_rgb(last_image))


def test_configure_with_a_missing_model_fails_cleanly_and_stays_silent(ros, tmp_path):
    context, executor, probe_node = ros
    missing = str(tmp_path / 'no-such-checkpoint')
    node = VLASpecLifecycleNode(node_name='vla_broken', context=context, parameter_overrides=[
        Parameter('model_path', value=missing), Parameter('enabled', value=True),
        Parameter('instruction', value=INSTRUCTION)])
    executor.add_node(node)
    try:
        probe = Probe(probe_node, 'vla_broken')
        life = Lifecycle(probe, 'vla_broken')
        assert not life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert node.serving is None
        assert _quiet(probe, 0) == 0
        # The parameter can be fixed while unconfigured (load-time parameters included) ...
        result = probe.set_param('model_path', 'tiny')
        assert result.successful, result.reason
        # ... but not the robots: each robot's own parameters were declared at start-up
        # (a robot added now would have no <robot>.enabled to stop it with).
        result = probe.set_param('robots', ['left', 'right'])
        assert not result.successful and result.reason.startswith('robots: fixed when the')
    finally:
        executor.remove_node(node)
        node.destroy_node()


def _tiny_lifecycle_node(ros, name: str, overrides: dict):
    """A managed node on the tiny model (a policy passed in), added to the executor."""
    from vla_spec_ros import VLAPolicy

    context, executor, _ = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    node = VLASpecLifecycleNode(policy, node_name=name, context=context,
                                parameter_overrides=[Parameter(k, value=v)
                                                     for k, v in overrides.items()])
    executor.add_node(node)
    return node


def _switches(node) -> dict:
    """The robot's `enabled` and `acting` values in its /diagnostics status."""
    status = node.serving.channels[0].diagnostic('pipeline_spec')
    return {kv.key: kv.value for kv in status.values if kv.key in ('enabled', 'acting')}


def test_enable_and_the_enabled_parameter_agree_while_inactive(ros):
    from std_srvs.srv import SetBool

    _, executor, probe_node = ros
    node = _tiny_lifecycle_node(ros, 'vla_enable', {
        'instruction': INSTRUCTION, 'unnorm_key': 'bridge_orig', 'max_action_age': 5.0,
        'max_linear_speed': 10.0, 'max_angular_speed': 20.0})                # enabled: false
    try:
        probe = Probe(probe_node, 'vla_enable')
        life = Lifecycle(probe, 'vla_enable')
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_INACTIVE
        # Inactive: the service is accepted as the parameter is, and says it waits.
        answer = probe.call(probe.enable_client, SetBool.Request(data=True))
        assert answer.success, answer.message
        assert 'inactive' in answer.message and 'once activated' in answer.message
        assert probe.get_param('enabled') is True
        # /diagnostics tells the switch from acting: before, `enabled` said false here.
        assert _switches(node) == {'enabled': 'true', 'acting': 'false'}
        wait_until(lambda: probe.image_pub.get_subscription_count() > 0, what='subscription')
        assert _quiet(probe, 0) == 0                 # kept, not acted on: still nothing
        assert probe.set_param('enabled', False).successful
        answer = probe.call(probe.enable_client, SetBool.Request(data=False))
        assert answer.success and probe.get_param('enabled') is False
        assert probe.set_param('enabled', True).successful
        assert _quiet(probe, 0) == 0
        # Activate alone then acts: `enabled` was set before.
        assert life.transition(Transition.TRANSITION_ACTIVATE)
        assert _switches(node) == {'enabled': 'true', 'acting': 'true'}
        image = probe.raw_image(_frame(np.random.default_rng(3)))
        twist = probe.send(image, lambda: probe.twists.find(
            lambda m: m.header.stamp == image.header.stamp), restamp=True)[1]
        assert not is_zero(twist)
    finally:
        executor.remove_node(node)
        node.destroy_node()


@pytest.mark.parametrize('robots', [[], ['arm_a', 'arm_b']], ids=['one', 'two'])
def test_enable_is_offered_in_every_state_by_one_server(ros, robots):
    """docs/node.md: `ros2 service call /vla_spec/enable ...` is accepted in every state. It
    existed only while configured: unconfigured (before the first configure, after cleanup)
    the call waited forever for a service that was not there."""
    from std_srvs.srv import SetBool

    from vla_spec_ros.ros.servo_presence import server_gids

    _, executor, probe_node = ros
    name = f'vla_enable_states_{len(robots)}'
    overrides = {'instruction': INSTRUCTION, 'unnorm_key': 'bridge_orig'}
    if robots:
        overrides['robots'] = robots
    node = _tiny_lifecycle_node(ros, name, overrides)
    service = f'/{robots[0]}/enable' if robots else f'/{name}/enable'
    parameter = f'{robots[0]}.enabled' if robots else 'enabled'
    client = probe_node.create_client(SetBool, service)
    try:
        probe = Probe(probe_node, name)
        life = Lifecycle(probe, name)
        for flag, transition in ((True, None), (False, Transition.TRANSITION_CONFIGURE),
                                 (True, Transition.TRANSITION_CLEANUP)):
            if transition is not None:
                assert life.transition(transition)
            assert client.wait_for_service(timeout_sec=10.0), f'no {service} ({transition})'
            wait_until(lambda: len(server_gids(probe_node, service)) == 1,
                       what=f'one server of {service}')
            answer = probe.call(client, SetBool.Request(data=flag))
            assert answer.success, answer.message
            assert probe.get_param(parameter) is flag
    finally:
        probe_node.destroy_client(client)
        executor.remove_node(node)
        node.destroy_node()


def test_no_parameter_is_deleted_nor_a_robots_value_set_node_wide_in_any_state(ros):
    """`ros2 param delete` of a list parameter was accepted (rclpy undeclares a dynamically
    typed one): a deleted joint_max_velocity read as no limit and could never be set again.
    And on a managed node serving robots a and b, a node-wide max_linear_speed set while
    unconfigured was accepted, then ignored for a.max_linear_speed once configured (the
    configured node refuses it). Both are refused in every state; a robot's own value is
    taken, and a refusal of it names the robot's parameter."""
    _, executor, probe_node = ros
    node = _tiny_lifecycle_node(ros, 'vla_param_states', {
        'robots': ['a', 'b'], 'unnorm_key': 'bridge_orig', 'joint_max_velocity': [0.5] * 6})
    try:
        probe = Probe(probe_node, 'vla_param_states')
        life = Lifecycle(probe, 'vla_param_states')
        for transition in (None, Transition.TRANSITION_CONFIGURE,
                           Transition.TRANSITION_ACTIVATE):
            if transition is not None:
                assert life.transition(transition)
            for name in ('joint_max_velocity', 'a.joint_max_velocity', 'a.state_joint_names'):
                result = probe.delete_param(name)
                assert not result.successful and 'cannot be deleted' in result.reason, name
            assert probe.get_param('a.joint_max_velocity') == [0.5] * 6
            result = probe.set_param('max_linear_speed', 0.05)
            assert not result.successful
            assert 'set <robot>.max_linear_speed' in result.reason, result.reason
            assert probe.get_param('max_linear_speed') != 0.05
            assert probe.set_param('a.max_linear_speed', 0.05).successful
            assert probe.set_param('a.max_linear_speed', 0.25).successful
            if transition is not None:      # the checkpoint's checks name the robot's value
                result = probe.set_param('b.unnorm_key', 'zzz')
                assert not result.successful
                assert result.reason.startswith("b.unnorm_key: 'zzz' not in"), result.reason
    finally:
        executor.remove_node(node)
        node.destroy_node()


def test_a_configure_that_fails_in_any_way_says_why(ros, monkeypatch):
    """A load failing with something other than bad input (a GPU out of memory, a missing
    module) fails the configure with its reason in the log, as a missing checkpoint does;
    before, rclpy swallowed it and only on_error's line was logged."""
    from ros_probe import LogProbe

    from vla_spec_ros.ros import lifecycle_node

    def out_of_memory(*args, **kwargs):
        raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')
    monkeypatch.setattr(lifecycle_node, 'load_for_node', out_of_memory)
    context, executor, probe_node = ros
    log = LogProbe(probe_node, 'vla_oom')
    node = VLASpecLifecycleNode(node_name='vla_oom', context=context, parameter_overrides=[
        Parameter('model_path', value='tiny')])
    executor.add_node(node)
    try:
        life = Lifecycle(Probe(probe_node, 'vla_oom'), 'vla_oom')
        assert not life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED and node.serving is None
        log.wait_for('configure failed: RuntimeError: CUDA out of memory')
    finally:
        log.close()
        executor.remove_node(node)
        node.destroy_node()


@pytest.mark.skipif(importlib.util.find_spec('tf2_ros') is not None,
                    reason='needs a machine without tf2_ros (pose targets from TF then load)')
def test_a_configure_that_fails_midway_leaves_no_topic_behind(ros, tmp_path, monkeypatch):
    """pose_targets without tool_pose_topic needs TF, missing here: the robot's channel fails
    after its image subscription, twist and gripper publishers were made. They go with it:
    the node is left as it was before configure (before, they stayed, fed an orphan channel
    and were made again by the next configure)."""
    from vla_spec_ros import VLAPolicy

    from vla_spec_ros.recording import FrameRecorder

    opened = []
    monkeypatch.setattr(FrameRecorder, '_open_split', _tracking(FrameRecorder._open_split,
                                                                opened))
    context, executor, probe_node = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    node = VLASpecLifecycleNode(policy, node_name='vla_midway', context=context,
                                parameter_overrides=[
                                    Parameter('pose_targets', value=True),
                                    Parameter('unnorm_key', value='bridge_orig'),
                                    Parameter('record_dir', value=str(tmp_path / 'rec'))])
    executor.add_node(node)
    try:
        before = ({p.topic_name for p in node.publishers},
                  {s.topic_name for s in node.subscriptions}, len(list(node.services)))
        life = Lifecycle(Probe(probe_node, 'vla_midway'), 'vla_midway')
        assert not life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED and node.serving is None
        after = ({p.topic_name for p in node.publishers},
                 {s.topic_name for s in node.subscriptions}, len(list(node.services)))
        assert after == before, (before, after)
        # ... and no recording open (before, each failed configure left a bag open).
        assert opened and all(recorder.closed for recorder in opened)
    finally:
        executor.remove_node(node)
        node.destroy_node()


def _tracking(method, seen):
    """`method` that also appends its object to `seen`."""
    def tracked(self, *args, **kwargs):
        seen.append(self)
        return method(self, *args, **kwargs)
    return tracked


def test_a_recording_that_fails_stops_recording_not_the_robot(
        ros, tmp_path, monkeypatch, capfd):
    """A full disk while recording: before, the worker took the write's OSError for an
    engine failure, held every robot and reset the engine on every frame (the robot never
    moved again), and the close at cleanup raised again and left the node finalized with its
    model loaded. Now that robot's recording stops with the reason in the log, the robot is
    served, and cleanup completes."""
    import errno

    from vla_spec_ros.recording import FrameRecorder

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, 'No space left on device')
    monkeypatch.setattr(FrameRecorder, 'record', disk_full)
    monkeypatch.setattr(FrameRecorder, 'close', disk_full)
    context, executor, probe_node = ros
    node = _recording_node(ros, 'vla_disk_full', tmp_path / 'full')
    try:
        probe = Probe(probe_node, 'vla_disk_full')
        life = Lifecycle(probe, 'vla_disk_full')
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.transition(Transition.TRANSITION_ACTIVATE)
        for seed in (1, 2, 3):          # the first fails to record, the next are not recorded
            image = probe.raw_image(_frame(np.random.default_rng(seed)))
            twist = probe.send(image, lambda: probe.twists.find(
                lambda m: m.header.stamp == image.header.stamp))[1]
            assert not is_zero(twist)
        assert 'engine error' not in node.serving.stats_snapshot()['hold_reason']
        assert life.transition(Transition.TRANSITION_DEACTIVATE)
        assert life.transition(Transition.TRANSITION_CLEANUP)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED and node.serving is None
    finally:
        executor.remove_node(node)
        node.destroy_node()
    log = capfd.readouterr().err
    assert 'recording of' in log and 'stopped' in log and 'No space left' in log, log


def test_a_cleanup_that_fails_midway_leaves_the_node_unconfigured_and_reconfigurable(
        ros, monkeypatch):
    """Serving.destroy raising partway (a device error, say): before, cleanup went to the
    error transition, whose hold published on outputs already destroyed and raised again, and
    rclpy finalized the node with its model still loaded (only a restart recovered). Now the
    failure is logged, the model let go, and the node is unconfigured and can configure."""
    from vla_spec_ros import VLAPolicy
    from vla_spec_ros.ros.serving import Serving

    destroy = Serving.destroy

    def failing_destroy(self):
        destroy(self)
        raise RuntimeError('device error while freeing')
    monkeypatch.setattr(Serving, 'destroy', failing_destroy)
    context, executor, probe_node = ros
    policy = VLAPolicy.from_pretrained('tiny', restrict_to_action_tokens=True)
    node = VLASpecLifecycleNode(policy, node_name='vla_bad_cleanup', context=context,
                                parameter_overrides=[Parameter('unnorm_key',
                                                               value='bridge_orig')])
    executor.add_node(node)
    try:
        life = Lifecycle(Probe(probe_node, 'vla_bad_cleanup'), 'vla_bad_cleanup')
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.transition(Transition.TRANSITION_CLEANUP)
        assert life.state() == State.PRIMARY_STATE_UNCONFIGURED and node.serving is None
        monkeypatch.setattr(Serving, 'destroy', destroy)
        assert life.transition(Transition.TRANSITION_CONFIGURE)
        assert life.state() == State.PRIMARY_STATE_INACTIVE
    finally:
        executor.remove_node(node)
        node.destroy_node()
