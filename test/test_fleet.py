"""A fleet of engines: launch/fleet.launch.py's options, and engine processes over real DDS.

Without `launch` (pip-only rclpy) the engines are started as launch_ros would start them: the
options `fleet.launch.py` builds from a fleet file, turned into `python -m
vla_spec_ros.ros.node --ros-args ...` (test/launch_util.py). Checked over DDS (rclpy + Fast DDS,
each test on its own domain):

- a failed engine is isolated and restarted: two engine processes serve two robots each; the
  probe publishes camera frames for all four; one engine is killed with SIGKILL: its robots get
  no command from then on (messages in flight aside), the other two keep theirs, the engine's
  recording is readable up to its last closed split, and the engine started again (as
  `respawn` would) serves its robots from their fresh frames. Every command carries the stamp
  of a frame published for its robot, in increasing order per robot.
- overload is fair and bounded: six robots at 30 Hz on one engine (more than it answers on
  two cores): each robot's answered fraction is above half the mean, no robot waits long
  between actions, no action is older than `max_action_age`, and /diagnostics says the engine
  is saturated (WARN) with per-robot answered fractions.
"""
import importlib.util
import os
import pathlib
import re
import signal
import subprocess
import threading
import time

import numpy as np
import pytest
import yaml

import launch_util

ROOT = pathlib.Path(__file__).resolve().parents[1]
HAS_ROS = all(importlib.util.find_spec(m) is not None
              for m in ('rclpy', 'sensor_msgs', 'geometry_msgs', 'std_srvs', 'diagnostic_msgs'))
HAS_TORCH = importlib.util.find_spec('torch') is not None
needs_ros = pytest.mark.skipif(not (HAS_ROS and HAS_TORCH),
                               reason='needs rclpy + ROS message wheels and torch')
# Other tests use 11..230; the two DDS tests here take 1..10 (distinct from each other).
KILL_DOMAIN_ID = 1 + (os.getpid() % 10)
OVERLOAD_DOMAIN_ID = 1 + ((os.getpid() + 5) % 10)
IN_FLIGHT_S = 0.5           # a command published before the kill may still arrive this late


def load_module():
    return launch_util.load_launch_module('fleet.launch.py')


def _fleet(**engines):
    return {'fleet': {'engines': engines}}


# ---- the launch file's pure functions (no launch, no ROS) -----------------------------------


def test_shipped_fleet_file_gives_each_engine_its_device_robots_and_remaps():
    module = load_module()
    options = module.fleet_options(launch_util.default_values(module))
    assert [o['name'] for o in options] == ['vla_gpu0', 'vla_gpu1']
    first, second = (o['parameters'][1] for o in options)
    assert options[0]['parameters'][0] == str(ROOT / 'config' / 'robot.yaml')
    assert first['device'] == 'cuda:0' and first['robots'] == ['arm0', 'arm1']
    assert second['device'] == 'cuda:1' and second['robots'] == ['arm2', 'arm3']
    assert second['max_prefills_per_step'] == 2 and 'max_prefills_per_step' not in first
    # Each robot's own values go to the engine that serves it, and only there.
    assert first['arm0.frame_id'] == 'arm0_tool0' and 'arm2.frame_id' not in first
    assert second['arm3.frame_id'] == 'arm3_tool0' and 'arm0.frame_id' not in second
    assert dict(options[0]['remappings'])['arm0/twist'] == '/arm0/servo_node/delta_twist_cmds'
    assert options[1]['remappings'] == []
    # A chunked model's trajectory is remapped like any other robot topic.
    data = yaml.safe_load((ROOT / 'config' / 'fleet.yaml').read_text())
    data['fleet']['robots']['arm1']['topics'] = {'trajectory': '/arm1/cartesian/trajectory'}
    remaps = dict(module.engine_options(module.check_fleet(data), 'vla_gpu0')['remappings'])
    assert remaps['arm1/trajectory'] == '/arm1/cartesian/trajectory'
    for o in options:       # one namespace for the fleet: /arm0/... whichever engine
        assert o['namespace'] == '' and o['respawn'] is True and o['respawn_delay'] == 2.0
        assert o['respawn_max_retries'] == module.DEFAULT_RESPAWN_MAX_RETRIES == 5
    # One machine starts its own engines; respawn can be turned off or delayed.
    values = launch_util.default_values(module, engines='vla_gpu1', respawn='false',
                                        respawn_delay='5')
    (only,) = module.fleet_options(values)
    assert only['name'] == 'vla_gpu1' and only['respawn'] is False
    assert only['respawn_delay'] == 5.0
    for bad, words in ((dict(engines='vla_gpu9'), 'vla_gpu9'), (dict(respawn='yes'), 'respawn'),
                       (dict(respawn_delay='soon'), 'respawn_delay')):
        with pytest.raises(ValueError, match=words):
            module.fleet_options(launch_util.default_values(module, **bad))


def test_an_engine_named_twice_in_the_engines_argument_is_refused():
    """Before, `engines:=e0,e0` (a typo, or a script joining two lists) started two nodes of
    engine e0: both served, and commanded, the same robots."""
    module = load_module()
    for argument in ('vla_gpu0,vla_gpu0', 'vla_gpu0, vla_gpu1, vla_gpu0'):
        values = launch_util.default_values(module, engines=argument)
        with pytest.raises(ValueError, match=r"\['vla_gpu0'\] named more than once"):
            module.fleet_options(values)
    values = launch_util.default_values(module, engines='vla_gpu1, vla_gpu0')
    assert [o['name'] for o in module.fleet_options(values)] == ['vla_gpu1', 'vla_gpu0']


def test_fleet_file_mistakes_fail_before_any_engine_starts():
    check = load_module().check_fleet
    one = {'device': 'cpu', 'robots': ['a']}
    cases = [
        ({'fleet': {}}, 'no engine'),
        (_fleet(e0={'robots': ['a']}, e1={'robots': ['b', 'a']}), 'a is also served by e0'),
        (_fleet(e0={'robots': []}), 'non-empty list'),
        (_fleet(**{'0e': one}), 'valid node name'),
        (_fleet(e0={'robots': ['bad-name']}), 'not a valid name'),
        (_fleet(e0=dict(one, gpu=1)), "unknown keys \\['gpu'\\]"),
        (_fleet(e0=dict(one, parameters={'robots': ['x']})), "set 'robots'"),
        (_fleet(e0=dict(one, parameters={'max_inflite': 3})), 'max_inflite'),
        ({'fleet': {'engines': {'e0': one}, 'robots': {'b': {}}}}, 'no engine serves b'),
        ({'fleet': {'engines': {'e0': one}, 'robots': {'a': {'frame': 'x'}}}}, 'frame'),
        ({'fleet': {'engines': {'e0': one}, 'robots': {'a': {'topics': {'twist': 'rel'}}}}},
         'absolute'),
        ({'fleet': {'engines': {'e0': one}, 'robots': {'a': {'topics': {'cmd': '/x'}}}}},
         'cmd'),
        ({'fleet': {'engines': {'e0': one}, 'robots': {'a': {'topics': {'1/image': '/x'}}}}},
         '1/image'),
        ({'fleet': {'engines': {'e0': one}, 'namespace': 'bad ns'}}, 'namespace'),
        ({'fleet': {'engines': {'e0': one}, 'respawn_delay': -1}}, 'respawn_delay'),
        ({'fleet': {'engines': {'e0': one}, 'respawn_max_retries': -2}}, 'respawn_max_retries'),
        ({'fleet': {'engines': {'e0': one}, 'respawn_max_retries': 1.5}}, 'respawn_max_retries'),
        ({'fleet': {'engines': {'e0': one}, 'respawn_max_retries': True}},
         'respawn_max_retries'),
        # two robots of one engine on one Servo (a shared value): the node would refuse it
        # at start-up, after loading its model
        ({'fleet': {'engines': {'e0': {'robots': ['a', 'b']}},
                    'parameters': {'servo_node': '/servo_node'}}},
         "fleet.robots.b \\(served by engine e0\\): servo_node '/servo_node' is also a's"),
        ({'fleet': {'engines': {'e0': {'robots': ['a', 'b']}},
                    'robots': {'a': {'tool_pose_topic': '/t'}, 'b': {'tool_pose_topic': '/t'}}}},
         'tool_pose_topic'),
    ]
    for data, words in cases:
        with pytest.raises(ValueError, match=words):
            check(data)
    fleet = check({'fleet': {'engines': {'e0': one}, 'namespace': 'cell1',
                             'parameters': {'enabled': True}}})
    options = load_module().engine_options(fleet, 'e0')
    assert options['namespace'] == 'cell1'
    assert options['parameters'][1] == {'enabled': True, 'device': 'cpu', 'robots': ['a']}
    for retries in (0, -1, 20):     # -1: no limit (launch's own convention)
        fleet = check({'fleet': {'engines': {'e0': one}, 'respawn_max_retries': retries}})
        assert load_module().engine_options(fleet, 'e0')['respawn_max_retries'] == retries


@pytest.mark.parametrize('text, words', [
    # a second engine of the same name: its robot arm0 lost its engine
    ('  engines:\n    e0: {robots: [arm0]}\n    e0: {robots: [arm1]}\n',
     "line 5: key 'e0' given twice \\(first on line 4\\)"),
    # a robot's section twice: its speed limit silently dropped
    ('  engines:\n    e0: {robots: [arm0]}\n  robots:\n'
     '    arm0: {max_linear_speed: 0.1}\n    arm0: {frame_id: arm0_tool0}\n',
     "line 7: key 'arm0' given twice \\(first on line 6\\)"),
    # one line, two values of one parameter
    ('  engines:\n    e0: {robots: [arm0], device: cpu, device: cuda}\n',
     "line 4: key 'device' given twice"),
])
def test_a_key_given_twice_in_the_fleet_file_is_refused(tmp_path, text, words):
    """Before, the fleet file was read with yaml.safe_load, which keeps the last of two equal
    keys: a repeated engine or robot section silently replaced the first."""
    path = tmp_path / 'fleet.yaml'
    path.write_text('fleet:\n  parameters: {model_path: tiny}\n' + text)
    with pytest.raises(ValueError, match=re.escape(f'{path}: ') + words):
        load_module().load_fleet(str(path))
    # Merge keys (`<<: *shared`) may still be overridden by the mapping's own keys.
    path.write_text('shared: &shared {device: cpu, robots: [arm0]}\n'
                    'fleet:\n  engines:\n    e0: {<<: *shared, device: cuda}\n')
    assert load_module().load_fleet(str(path))['engines']['e0']['device'] == 'cuda'


def test_the_params_file_is_found_beside_the_fleet_file_or_refused(tmp_path, monkeypatch):
    """Before, a params_file that did not exist, or a relative one launch was not started
    beside, was passed on as it was: launch_ros warned "Parameter file path is not a file"
    and every engine started on the default values (the default model)."""
    module = load_module()
    cell = tmp_path / 'cell'
    cell.mkdir()
    (cell / 'my_robot.yaml').write_text('/**:\n  ros__parameters:\n    enabled: false\n')
    fleet_file = cell / 'fleet.yaml'
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)                   # launch started from another folder
    for given in ('my_robot.yaml', str(cell / 'my_robot.yaml')):
        fleet_file.write_text(f'fleet:\n  params_file: {given}\n'
                              '  engines:\n    e0: {robots: [arm0]}\n')
        options = module.engine_options(module.load_fleet(str(fleet_file)), 'e0')
        assert options['parameters'][0] == str(cell / 'my_robot.yaml')
    fleet_file.write_text('fleet:\n  params_file: config/my_robot.yaml\n'
                          '  engines:\n    e0: {robots: [arm0]}\n')
    with pytest.raises(ValueError, match=re.escape(
            f'fleet.params_file: {cell}/config/my_robot.yaml is not a file')):
        module.load_fleet(str(fleet_file))
    with pytest.raises(ValueError, match='params_file: expected a file path'):
        module.check_fleet({'fleet': {'params_file': 3, 'engines': {'e0': {'robots': ['a']}}}})


def test_fleet_values_are_typed_before_any_engine_starts():
    """Before, only parameter names were checked: `arm0: {max_linear_speed: 1}` (an int for a
    float) passed, rclpy refused it when the engine started, and launch restarted the engine
    for ever, every robot of it stopped. Now an int becomes the float the parameter is, and a
    value of the wrong type or range is refused naming the engine, the robot and the
    parameter."""
    module = load_module()
    fleet = module.check_fleet({'fleet': {
        'parameters': {'max_action_age': 1, 'enabled': True},
        'engines': {'e0': {'robots': ['arm0', 'arm1'],
                           'parameters': {'image_sync_tolerance': 0, 'max_inflight': 14}}},
        'robots': {'arm0': {'max_linear_speed': 1, 'frame_id': 'arm0_tool0'},
                   'arm1': {'joint_max_velocity': [1, 2.5]}}}})
    values = module.engine_options(fleet, 'e0')['parameters'][1]
    floats = {'max_action_age': 1.0, 'image_sync_tolerance': 0.0, 'arm0.max_linear_speed': 1.0}
    for name, value in floats.items():
        assert values[name] == value and type(values[name]) is float, name
    assert values['arm1.joint_max_velocity'] == [1.0, 2.5]
    assert all(type(v) is float for v in values['arm1.joint_max_velocity'])
    assert type(values['max_inflight']) is int and values['enabled'] is True
    assert values['arm0.frame_id'] == 'arm0_tool0'
    one = {'device': 'cpu', 'robots': ['arm0']}
    cases = [
        ({'robots': {'arm0': {'max_linear_speed': 'fast'}}},
         r'fleet.robots.arm0 \(served by engine e0\): max_linear_speed: must be a finite'),
        ({'robots': {'arm0': {'control_period': 0.0}}},
         r'fleet.robots.arm0 \(served by engine e0\): control_period'),
        ({'robots': {'arm0': {'chunk_blend': 'average'}}}, 'chunk_blend'),
        ({'engines': {'e0': dict(one, parameters={'max_inflight': 2.5})}},
         'fleet.engines.e0.parameters: max_inflight: must be an integer'),
        ({'parameters': {'enabled': 'yes'}}, 'fleet.parameters: enabled: expected bool'),
        ({'parameters': {'mode': 'pipline'}}, 'fleet.parameters: mode'),
    ]
    for changes, words in cases:
        with pytest.raises(ValueError, match=words):
            module.check_fleet({'fleet': dict({'engines': {'e0': one}}, **changes)})


def test_a_fleet_robot_may_remap_its_joint_state_and_camera_slot_topics():
    """Before, a fleet file refused a joint-space robot's topics (joint_states, joint_jog,
    joint_trajectory, state) and a second camera's (<slot>/image): such a robot could not be
    plugged into its broadcaster, Servo or controller from the fleet file."""
    module = load_module()
    topics = {'joint_states': '/a/joint_states', 'state': '/a/state',
              'joint_jog': '/a/servo_node/delta_joint_cmds',
              'joint_trajectory': '/a/arm_controller/joint_trajectory',
              'reasoning': '/a/plan', 'wrist/image': '/a/wrist/image_raw',
              'wrist/image/compressed': '/a/wrist/image_raw/compressed'}
    fleet = module.check_fleet({'fleet': {
        'engines': {'e0': {'device': 'cpu', 'robots': ['a'],
                           'parameters': {'image_slots': ['base', 'wrist']}}},
        'robots': {'a': {'topics': topics}}}})
    remaps = dict(module.engine_options(fleet, 'e0')['remappings'])
    assert remaps == {f'a/{topic}': target for topic, target in topics.items()}


def _slot_fleet(topics, parameters=None, **fleet):
    return {'fleet': dict(fleet, parameters=parameters or {},
                          engines={'e0': {'robots': ['arm0']}},
                          robots={'arm0': {'topics': {t: '/arm0/camera' for t in topics}}})}


def test_a_camera_remap_names_one_of_the_engines_image_slots(tmp_path):
    """Before, any `<name>/image` was accepted: a typo (`wirst/image`), or `image` for a
    robot whose engine has image_slots (it has `<slot>/image` topics only), remapped a topic
    nobody subscribes, and the camera's frames never reached the engine."""
    module = load_module()
    two = {'image_slots': ['base', 'wrist']}
    for topics, words in ((['base/image', 'wirst/image'], r"\['wirst/image'\]"),
                          (['image'], r"\['image'\]"),
                          (['wrist/image/compressed', 'image/compressed'],
                           r"\['image/compressed'\]")):
        with pytest.raises(ValueError, match=r"fleet.robots.arm0.topics: unknown keys "
                           + words + r"; with its engine's image_slots \['base', 'wrist'\]"):
            module.check_fleet(_slot_fleet(topics, two))
    module.check_fleet(_slot_fleet(['base/image', 'wrist/image/compressed'], two))
    # No image_slots (config/robot.yaml's []): one camera, `image`, and no `<slot>/image`.
    module.check_fleet(_slot_fleet(['image', 'image/compressed']))
    with pytest.raises(ValueError, match=r"\['wrist/image'\]; with its engine's image_slots"):
        module.check_fleet(_slot_fleet(['wrist/image']))
    # The engine's own value wins over the shared one.
    data = _slot_fleet(['image'], two)
    data['fleet']['engines']['e0']['parameters'] = {'image_slots': []}
    module.check_fleet(data)


@pytest.mark.parametrize('section, applies', [
    ('/**:\n  ros__parameters:\n', True),
    ('cell:\n  e0:\n    ros__parameters:\n', True),      # nested namespace, rcl's form
    ('/cell/e0:\n  ros__parameters:\n', True),
    ('/**/e0:\n  ros__parameters:\n', True),
    ('e1:\n  ros__parameters:\n', False),                # another node's section
])
def test_image_slots_are_read_from_the_params_file_section_of_the_engine(tmp_path, section,
                                                                         applies):
    module = load_module()
    params_file = tmp_path / 'params.yaml'
    indent = ' ' * (section.count('\n') * 2)
    params_file.write_text(section + indent + 'image_slots: [base, wrist]\n')
    fleet = dict(params_file=str(params_file), namespace='cell')
    module.check_fleet(_slot_fleet(['base/image'], **fleet))
    if applies:
        with pytest.raises(ValueError, match=r"\['wirst/image'\]"):
            module.check_fleet(_slot_fleet(['base/image', 'wirst/image'], **fleet))
    else:       # no section sets them: a checkpoint may, so they are not known at launch
        module.check_fleet(_slot_fleet(['base/image', 'wirst/image', 'image'], **fleet))


def test_engine_summary_flags_saturation_and_the_least_answered_robot():
    from vla_spec_ros.ros.diagnostics import InferenceStats, engine_summary

    robots = {name: InferenceStats(window_s=10.0) for name in ('a', 'b')}
    for i in range(100):                      # 10 s at 10 Hz per robot
        t = 100.0 + 0.1 * i
        for name, stats in robots.items():
            stats.record_received(t)
        robots['a'].record_action(t + 0.05, 0.05, age_s=0.08)
        if i % 2:
            robots['b'].record_action(t + 0.05, 0.05, age_s=0.3)
        else:
            robots['b'].record_dropped(1, t)
    snaps = {name: stats.snapshot(110.0) for name, stats in robots.items()}
    assert snaps['a']['answered_fraction'] == pytest.approx(1.0, abs=0.02)
    assert snaps['b']['answered_fraction'] == pytest.approx(0.5, abs=0.02)
    assert snaps['b']['dropped_fraction'] == pytest.approx(0.5, abs=0.02)
    assert snaps['b']['action_age_max_ms'] == pytest.approx(300.0)
    summary = engine_summary(snaps, 10.0)
    assert summary['saturated'] and summary['least_answered_robot'] == 'b'
    assert summary['dropped_fraction'] == pytest.approx(0.25, abs=0.02)
    assert summary['action_age_max_ms'] == pytest.approx(300.0)
    # The window forgets: 20 s later nothing was received, nothing is saturated.
    later = engine_summary({n: s.snapshot(130.0) for n, s in robots.items()}, 10.0)
    assert not later['saturated'] and later['frames_in_window'] == 0


# ---- over DDS: engine processes --------------------------------------------------------------

class EngineProcess:
    """One engine node process; its output goes to a file (a pipe nobody reads would fill)."""

    def __init__(self, argv, env, log_path):
        self.log_path = log_path
        self._log = open(log_path, 'a')
        self.popen = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                      env=env, cwd=str(ROOT))

    def output(self) -> str:
        return pathlib.Path(self.log_path).read_text()

    def wait_ready(self, timeout=90.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if 'ready' in self.output():
                return
            assert self.popen.poll() is None, self.output()
            time.sleep(0.1)
        raise AssertionError(f'engine not ready after {timeout} s:\n{self.output()}')

    def stop(self):
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._log.close()


def _camera_frames(robot_index: int, count: int = 3):
    rng = np.random.default_rng(100 + robot_index)
    return [rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for _ in range(count)]


class Cameras:
    """A camera per robot on a thread of its own (an rclpy timer lags on a busy 2-core
    machine), each frame stamped with the probe's clock plus the robot's index in ns, so no two
    robots ever share a stamp; and every robot's twists, with their receipt time and the time
    they were published (the DDS source timestamp: the node's system clock at publish)."""

    def __init__(self, node, robots, hz, image_topics=None, twist_topics=None):
        from geometry_msgs.msg import TwistStamped
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        from vla_spec_ros.image_messages import array_to_image

        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        image_topics, twist_topics = image_topics or {}, twist_topics or {}
        self.node, self.robots, self._period = node, list(robots), 1.0 / hz
        self._to_image = array_to_image
        self.frames = {r: _camera_frames(i) for i, r in enumerate(self.robots)}
        self._pubs = {r: node.create_publisher(Image, image_topics.get(r, f'/{r}/image'), qos)
                      for r in self.robots}
        self._lock = threading.Lock()
        self.sent = {r: [] for r in self.robots}          # (monotonic, stamp ns)
        # (monotonic receipt, system time of publish in ns, header stamp in ns, is zero)
        self.twists = {r: [] for r in self.robots}
        for robot in self.robots:
            node.create_subscription(TwistStamped, twist_topics.get(robot, f'/{robot}/twist'),
                                     lambda m, info, r=robot: self._on_twist(r, m, info), qos)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        tick = 0
        next_time = time.monotonic()
        while not self._stop.is_set():
            now_ns = self.node.get_clock().now().nanoseconds
            for index, robot in enumerate(self.robots):
                stamp_ns = now_ns + index
                frames = self.frames[robot]
                msg = self._to_image(frames[tick % len(frames)], 'rgb8')
                msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(stamp_ns, 10 ** 9)
                with self._lock:
                    self.sent[robot].append((time.monotonic(), stamp_ns))
                self._pubs[robot].publish(msg)
            tick += 1
            next_time += self._period
            delay = next_time - time.monotonic()
            if delay > 0:
                self._stop.wait(delay)
            else:
                next_time = time.monotonic()

    def _on_twist(self, robot, msg, info):
        t = msg.twist
        zero = not any((t.linear.x, t.linear.y, t.linear.z, t.angular.x, t.angular.y,
                        t.angular.z))
        stamp_ns = msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec
        with self._lock:
            self.twists[robot].append((time.monotonic(), info['source_timestamp'], stamp_ns,
                                       zero))

    def twists_of(self, robot, since=0.0, until=float('inf')):
        """Every twist of `robot` received in [since, until) (monotonic seconds)."""
        with self._lock:
            return [item for item in self.twists[robot] if since <= item[0] < until]

    def actions(self, robot, since=0.0, until=float('inf')):
        """The twists that answer a frame of `robot` (its stamp: a hold carries the node's
        time instead), received in [since, until)."""
        sent = set(self.sent_stamps(robot))
        return [item for item in self.twists_of(robot, since, until) if item[2] in sent]

    def sent_stamps(self, robot):
        with self._lock:
            return [stamp for _, stamp in self.sent[robot]]

    def stop(self):
        self._stop.set()
        self._thread.join(timeout=5.0)


def _wait(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f'timed out after {timeout} s waiting for {what}')


def _engine_commands(fleet_data, tmp_path, domain_id):
    """The fleet file written, loaded by the launch file, each engine's command line."""
    import yaml

    path = tmp_path / 'fleet.yaml'
    path.write_text(yaml.safe_dump(fleet_data))
    module = load_module()
    options = module.fleet_options(launch_util.default_values(module, fleet_file=str(path)))
    env = launch_util.child_env(domain_id)
    return {o['name']: launch_util.ros_args_command('vla_spec_ros.ros.node', o)
            for o in options}, env


INSTRUCTIONS = {'a': 'open the drawer', 'b': 'push the button', 'c': 'reach the goal',
                'd': 'open the window'}


@needs_ros
def test_a_killed_engine_is_isolated_and_restarted(tmp_path):
    from ros_probe import ros_graph
    from vla_spec_ros.train.bag_frames import BagFrames

    record_dir = tmp_path / 'recorded'
    fleet = {'fleet': {
        'respawn_delay': 1.0,
        'parameters': {'model_path': 'metaworld-demo', 'enabled': True, 'torch_threads': 1,
                       'max_action_age': 1.0, 'diagnostics_period': 0.25},
        'engines': {
            'vla_e0': {'device': 'cpu', 'robots': ['a', 'b'],
                       'parameters': {'record_dir': str(record_dir), 'record_period': 0.0,
                                      'record_split_s': 0.5}},
            'vla_e1': {'device': 'cpu', 'robots': ['c', 'd']}},
        'robots': {r: {'instruction': text} for r, text in INSTRUCTIONS.items()}}}
    # One robot's topics remapped, as a real camera driver and Servo instance would need.
    fleet['fleet']['robots']['d']['topics'] = {'image': '/d/camera/image_raw',
                                               'twist': '/d/servo/delta_twist_cmds'}
    commands, env = _engine_commands(fleet, tmp_path, KILL_DOMAIN_ID)
    engines = {name: EngineProcess(argv, env, tmp_path / f'{name}.log')
               for name, argv in commands.items()}
    cameras = None
    try:
        with ros_graph(KILL_DOMAIN_ID, 'fleet_probe', num_threads=2) as (_, _, probe):
            cameras = Cameras(probe, INSTRUCTIONS, hz=10.0,
                              image_topics={'d': '/d/camera/image_raw'},
                              twist_topics={'d': '/d/servo/delta_twist_cmds'})
            for engine in engines.values():
                engine.wait_ready()
            _wait(lambda: all(len(cameras.actions(r)) >= 3 for r in INSTRUCTIONS), 60.0,
                  'actions for every robot')
            time.sleep(1.0)                  # a's and b's recordings close a split or two

            engines['vla_e0'].popen.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            engines['vla_e0'].popen.wait(timeout=10)
            after = killed + IN_FLIGHT_S
            # The other engine's robots go on: wait for their actions (a loaded runner gave
            # 4 in a fixed 3 s), then look at what the dead engine's robots got meanwhile.
            _wait(lambda: all(len(cameras.actions(r, since=after)) >= 5 for r in ('c', 'd')),
                  60.0, "the other engine's actions after the kill")
            for robot in ('a', 'b'):         # isolated: nothing from the dead engine
                assert cameras.twists_of(robot, since=after) == [], robot
            for robot in ('c', 'd'):
                assert len(cameras.actions(robot, since=after)) >= 5, robot

            # The killed engine's recordings read up to their last closed split.
            for index, robot in enumerate(('a', 'b')):
                (bag,) = sorted((record_dir / robot).iterdir())
                frames = [frame for frame, text in BagFrames(bag, '/camera/image',
                                                             '/instruction')
                          if text == INSTRUCTIONS[robot]]
                assert frames, robot
                own = _camera_frames(index)
                assert all(any(np.array_equal(f, o) for o in own) for f in frames), robot

            # Started again, as respawn does: it serves its robots from fresh frames.
            restarted = time.monotonic()
            engines['vla_e0'].stop()
            engines['vla_e0'] = EngineProcess(commands['vla_e0'], env,
                                              tmp_path / 'vla_e0.restarted.log')
            engines['vla_e0'].wait_ready()
            _wait(lambda: all(cameras.actions(r, since=restarted) for r in ('a', 'b')), 30.0,
                  'actions for a and b from the restarted engine')
            cameras.stop()
            time.sleep(0.5)
        for robot in INSTRUCTIONS:     # every command: a frame of its own robot, in order
            commands = [stamp for _, _, stamp, zero in cameras.twists_of(robot) if not zero]
            assert commands and set(commands) <= set(cameras.sent_stamps(robot)), robot
            stamps = [stamp for _, _, stamp, _ in cameras.actions(robot)]
            assert all(x < y for x, y in zip(stamps, stamps[1:])), robot
    finally:
        if cameras is not None:
            cameras.stop()
        for engine in engines.values():
            engine.stop()


@needs_ros
def test_overload_is_fair_bounded_and_reported(tmp_path):
    from diagnostic_msgs.msg import DiagnosticArray

    from ros_probe import Recorder, ros_graph

    # Six 60 Hz cameras: 360 frames/s, about twice what the engine answers on two cores
    # (120-160 frames/s in total; at 30 Hz a fast machine answered 88 % of them, not
    # overloaded). Overloaded still on a machine nearly twice as fast; on one three times
    # slower each robot is still answered several times a second.
    robots = [f'r{i}' for i in range(6)]
    max_age = 0.5
    fleet = {'fleet': {
        'parameters': {'model_path': 'metaworld-demo', 'enabled': True, 'torch_threads': 1,
                       'max_action_age': max_age, 'diagnostics_period': 0.5},
        'engines': {'vla_busy': {'device': 'cpu', 'robots': robots}},
        'robots': {r: {'instruction': 'open the drawer'} for r in robots}}}
    commands, env = _engine_commands(fleet, tmp_path, OVERLOAD_DOMAIN_ID)
    engine = EngineProcess(commands['vla_busy'], env, tmp_path / 'vla_busy.log')
    cameras = None
    try:
        with ros_graph(OVERLOAD_DOMAIN_ID, 'overload_probe', num_threads=2) as (_, _, probe):
            diagnostics = Recorder(probe.get_clock())
            probe.create_subscription(DiagnosticArray, '/diagnostics', diagnostics, 10)
            cameras = Cameras(probe, robots, hz=60.0)
            engine.wait_ready()
            _wait(lambda: all(cameras.actions(r) for r in robots), 60.0, 'every robot answered')
            start = time.monotonic()
            time.sleep(8.0)
            end = time.monotonic()
            cameras.stop()
            time.sleep(max_age)
            last = diagnostics.snapshot()[-1][1]
        statuses = {s.name: (s.level, s.message, {kv.key: kv.value for kv in s.values})
                    for s in last.status if s.name.startswith('/vla_busy:')}
    finally:
        if cameras is not None:
            cameras.stop()
        engine.stop()
    sent = {r: sum(1 for t, _ in cameras.sent[r] if start <= t < end) for r in robots}
    actions = {r: cameras.actions(r, since=start, until=end) for r in robots}
    answered = {r: len(actions[r]) / sent[r] for r in robots}
    mean = sum(answered.values()) / len(robots)
    # Fair by the node's own count (frames received, actions published) and by the probe's
    # (frames sent, twists answering them): each robot above half the mean.
    level, message, values = statuses['/vla_busy: engine']
    node_answered = {r: float(statuses[f'/vla_busy: inference ({r})'][2]['answered_fraction'])
                     for r in robots}
    node_mean = sum(node_answered.values()) / len(robots)
    assert 0.0 < node_mean < 0.85, node_answered      # overloaded indeed
    assert all(a > 0.5 * node_mean for a in node_answered.values()), node_answered
    assert all(a > 0.5 * mean for a in answered.values()), answered
    for robot in robots:
        times = [start] + [t for t, _, _, _ in actions[robot]] + [end]
        assert max(y - x for x, y in zip(times, times[1:])) < 2.0, robot    # no starving
        # Nothing older than max_action_age was published: each twist's age when the node
        # published it (the writer's source timestamp; the probe's receipt time would add the
        # delivery to a probe itself busy publishing 360 frames/s, which once reached 0.5 s).
        # The margin is the node's own time between its age check and the publish.
        ages = [(published - stamp) * 1e-9 for _, published, stamp, _ in actions[robot]]
        assert max(ages) < max_age + 0.1, (robot, max(ages))
    # /diagnostics: the engine is saturated (WARN, with the reason), each robot's fraction.
    assert level == bytes([1]) and message.startswith('saturated'), message
    assert values['saturated'] == 'true' and values['robots'] == str(len(robots))
    for robot in robots:
        _, _, own = statuses[f'/vla_busy: inference ({robot})']
        assert float(own['action_age_max_ms']) <= 1e3 * max_age
        assert float(own['dropped_fraction']) > 0.1
