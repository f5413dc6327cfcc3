"""ros/sample_history.py: the samples of one input key kept by time, against a plain list
searched whole (random times, in and out of order), and the joint-state input's pairing on a
1 kHz topic (before, a fixed 256 samples kept a quarter of a second of it)."""
import importlib.util

import numpy as np
import pytest

from vla_spec_ros.ros.sample_history import SampleHistory

HAS_MSGS = importlib.util.find_spec('sensor_msgs') is not None


def test_nearest_is_the_plain_searchs_on_random_times_in_any_order():
    rng = np.random.default_rng(0)
    for trial in range(20):
        history, kept = SampleHistory(), []
        times = rng.uniform(0.0, 10.0, size=200)
        if trial % 2:
            times = np.sort(times)                 # in order, as one publisher's stamps
        for i, t in enumerate(times):
            history.add((float(t), i, None), now_s=10.0, keep_s=100.0)
            kept.append((float(t), i, None))
            for query in rng.uniform(-1.0, 11.0, size=3):
                got = history.nearest(float(query))
                best = min(abs(s[0] - query) for s in kept)
                assert abs(got[0] - query) == best
        assert history.last_received == kept[-1]


def test_samples_are_kept_by_time_never_the_newest_dropped_and_capped():
    history = SampleHistory(max_samples=50)
    for i in range(30):                             # 8 Hz (exact binary times)
        history.add((i * 0.125, i, None), now_s=i * 0.125, keep_s=1.0)
    assert len(history) == 9                        # 1.0 s of 8 Hz, both ends in
    assert history.nearest(0.0)[0] == 2.625
    history.add((-5.0, 'old', None), now_s=3.625, keep_s=1.0)
    assert history.last_received[1] == 'old'        # the last received, whatever its time
    assert history.nearest(-5.0)[0] == 2.625        # ... but too old to keep
    lone = SampleHistory()
    lone.add((0.0, 'only', None), now_s=100.0, keep_s=1.0)
    assert lone.nearest(50.0)[1] == 'only'          # stale, yet reported as such
    flood = SampleHistory(max_samples=50)
    for i in range(500):
        flood.add((i * 1e-4, i, None), now_s=0.0, keep_s=10.0)
    assert len(flood) == 50 and flood.nearest(0.0)[1] == 450


@pytest.mark.skipif(not HAS_MSGS, reason='sensor_msgs (ROS 2 message wheels) not installed')
def test_a_1_khz_joint_state_still_pairs_with_an_image_0_4_s_old():
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState

    from fake_node import RecordingNode
    from vla_spec_ros.ros import params
    from vla_spec_ros.ros.message_time import stamp_at
    from vla_spec_ros.ros.state_input import JointStateInput

    joints = ['a', 'b']
    settings = params.settings_from_parameters({
        'state_input': 'joint_state', 'state_joint_names': joints, 'max_action_age': 1.0,
        'max_state_age': 0.01})[1]
    node = RecordingNode(100.0)
    state = JointStateInput(node, '~/', lambda: settings)
    on_state = node.on('joint_states')
    for i in range(600):                            # 0.6 s at 1 kHz, up to the clock's now
        t = 99.4 + i * 1e-3
        node.clock.now_s = t
        msg = JointState(name=joints, position=[t, -t])
        msg.header.stamp = stamp_at(Time(), t)
        on_state(msg)
    vector, problem = state.read_at(99.6, settings)         # the image: 0.4 s old
    assert problem is None, problem
    np.testing.assert_allclose(vector, [99.6, -99.6], atol=1e-9)
