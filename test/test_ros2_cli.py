"""The README's ROS 2 commands, run as written: `ros2 launch vla_spec_ros robot.launch.py`, then
`ros2 topic pub`, `ros2 service call`, `ros2 param` and `ros2 lifecycle` from another process.

The package is built with colcon once (launch_util.colcon_workspace) and launched from that
install space with the README's own launch line (the `tiny` preset). Every command line comes
from the README's or docs/node.md's bash blocks (ros2_commands.doc_commands); the test adds
only the discovery options of `ros2_commands.DISCOVERY_OPTIONS` (`--no-daemon` and a longer
wait for a loaded machine). The test's node publishes the camera the launch file remaps
(`/camera/image_raw`) and records the twists on `/servo_node/delta_twist_cmds`, in a domain of
its own. One launched node serves the checks of the plain node, in file order, the last one
stopping it with SIGINT; the managed node (`lifecycle:=true`) gets a launch of its own.
"""
import contextlib
import os
import pathlib
import re
import threading

import numpy as np
import pytest

import launch_util
import ros2_commands
from ros2_commands import doc_commands, find_command, launch_arguments

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = ROOT / 'README.md'
NODE_DOC = ROOT / 'docs' / 'node.md'
# 102..120, shared with test_ros2_fleet_launch.py (a third value); the managed node gets a
# domain of its own, so that a plain node left running by a failed test cannot answer for it.
DOMAIN_ID = 102 + (os.getpid() % 19)
MANAGED_DOMAIN_ID = 102 + ((os.getpid() + 9) % 19)
QUIET_S = 1.0               # no twist for this long after the node exited: nothing in transit
INACTIVE_FRAMES = 30        # camera frames offered to an inactive node (1 s at 30 Hz)
UP_TIMEOUT = 120.0          # launch + model load on a loaded 2-core machine
TIMEOUT = 60.0
NODE = '/vla_spec'
LATCHED_INSTRUCTION = 'open the drawer'
INCOMPATIBLE_QOS = 'incompatible QoS'
SKIP_REASON = ros2_commands.skip_reason()

pytestmark = pytest.mark.skipif(SKIP_REASON is not None, reason=str(SKIP_REASON))


def _launch_topics():
    module = launch_util.load_launch_module('robot.launch.py')
    values = launch_util.default_values(module)
    return values['camera_topic'], values['twist_topic']


CAMERA_TOPIC, TWIST_TOPIC = _launch_topics()


class Camera:
    """The test's camera: frames with fresh stamps on the launch file's camera topic, one at a
    time or streamed from a thread; `stamps` holds every stamp published (nanoseconds)."""

    def __init__(self, node):
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import Image

        self.node = node
        self.publisher = node.create_publisher(
            Image, CAMERA_TOPIC, QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE))
        self.stamps = set()
        self._rng = np.random.default_rng(0)
        self._stop = threading.Event()
        self._thread = None

    def publish(self) -> None:
        from vla_spec_ros.image_messages import array_to_image

        image = self._rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        msg = array_to_image(image, 'rgb8', stamp=self.node.get_clock().now().to_msg(),
                             frame_id='camera')
        self.stamps.add(msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec)
        self.publisher.publish(msg)

    def start(self, rate_hz: float = 30.0) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._stream, args=(1.0 / rate_hz,),
                                        daemon=True)
        self._thread.start()

    def _stream(self, period_s: float) -> None:
        while not self._stop.wait(period_s):
            self.publish()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


class Graph:
    """The test's side: the `ros2` runner, the probe node, the camera and the twists."""

    def __init__(self, ros2, probe, log_dir):
        from geometry_msgs.msg import TwistStamped
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from std_msgs.msg import String

        from ros_probe import Recorder

        self.ros2, self.probe, self.log_dir = ros2, probe, log_dir
        self.launched = None
        self.camera = Camera(probe)
        self.twists = Recorder(probe.get_clock())
        probe.create_subscription(TwistStamped, TWIST_TOPIC, self.twists,
                                  QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        # A latched instruction published before the node starts: transient local, as a task
        # manager publishes it; the node must receive it when it connects.
        from vla_spec_ros.ros.qos import INSTRUCTION_QOS
        self.latched = probe.create_publisher(String, f'{NODE}/instruction', INSTRUCTION_QOS)
        self.latched.publish(String(data=LATCHED_INSTRUCTION))

    def parameter(self, name):
        from rclpy.parameter import parameter_value_to_python
        from rclpy.parameter_client import AsyncParameterClient

        from ros_probe import wait_until

        client = AsyncParameterClient(self.probe, NODE)
        assert client.wait_for_services(timeout_sec=TIMEOUT), f'{NODE} has no parameter services'
        future = client.get_parameters([name])
        wait_until(future.done, timeout=TIMEOUT, what=f'get {name}')
        return parameter_value_to_python(future.result().values[0])

    def wait_for_parameter(self, name, value):
        from ros_probe import wait_until

        wait_until(lambda: self.parameter(name) == value, timeout=TIMEOUT,
                   what=f'{name} == {value!r}')

    def launch(self, argv, name):
        self.launched = self.ros2.launch(argv, self.log_dir / f'{name}.log')
        return self.launched

    def acting_twists(self, start=0):
        """Non-zero twists recorded after index `start`."""
        from ros_probe import is_zero

        return [msg for _, msg in self.twists.snapshot()[start:] if not is_zero(msg)]

    def wait_for_actions(self, count, start=0):
        from ros_probe import wait_until

        try:
            return wait_until(lambda: len(self.acting_twists(start)) >= count and
                              self.acting_twists(start), timeout=TIMEOUT,
                              what=f'{count} non-zero twists on {TWIST_TOPIC}')
        except AssertionError as exc:
            raise AssertionError(f'{exc}; launch printed:\n'
                                 f'{self.launched.output()[-4000:]}') from None

    def last_twist_when_quiet(self):
        """The last twist received, once none has arrived for QUIET_S (the node is gone: what
        it sent is delivered or lost by then)."""
        from ros_probe import wait_until

        def quiet():
            items = self.twists.snapshot()
            now = self.probe.get_clock().now().nanoseconds * 1e-9
            return items and now - items[-1][0] >= QUIET_S and items[-1][1]
        return wait_until(quiet, timeout=TIMEOUT, what=f'no twist for {QUIET_S} s')

    def unanswered_stamps(self, twists):
        """The stamps of `twists` that no camera frame carried."""
        stamps = {t.header.stamp.sec * 10**9 + t.header.stamp.nanosec for t in twists}
        return sorted(stamps - self.camera.stamps)


@contextlib.contextmanager
def _graph(tmp_path_factory, domain_id, name):
    from ros_probe import ros_graph

    ws, _ = launch_util.colcon_workspace()
    log_dir = tmp_path_factory.mktemp(f'{name}_logs')
    ros2 = ros2_commands.Ros2(ros2_commands.cli_env(ws, domain_id, log_dir), ws)
    with ros_graph(domain_id, f'{name}_probe') as (_, _, probe):
        graph = Graph(ros2, probe, log_dir)
        try:
            yield graph
        finally:
            graph.camera.stop()
            ros2.stop_daemon()


@pytest.fixture(scope='module')
def graph(tmp_path_factory):
    with _graph(tmp_path_factory, DOMAIN_ID, 'cli') as graph:
        yield graph


def readme_launch_line():
    """The README's launch line that runs without a checkpoint (the `tiny` preset)."""
    return find_command(doc_commands(README), 'ros2', 'launch', 'vla_spec_ros',
                        'robot.launch.py', model_path='tiny')


def wait_until_up(graph, launched):
    """The launched node answers its parameter services and says it is ready."""
    from rclpy.parameter_client import AsyncParameterClient

    launched.wait_for_output(r'\[vla_spec\]: ready', UP_TIMEOUT)
    client = AsyncParameterClient(graph.probe, NODE)
    assert client.wait_for_services(timeout_sec=TIMEOUT), launched.output()[-4000:]


@pytest.fixture(scope='module')
def robot(graph):
    """The README's `tiny` launch line, running (until the SIGINT test stops it)."""
    argv = readme_launch_line()
    with graph.launch(argv, 'robot') as launched:
        wait_until_up(graph, launched)
        yield launched


# ---- the plain node, one launch ---------------------------------------------------------------

def test_readme_launch_line_applies_its_arguments(graph, robot):
    arguments = launch_arguments(readme_launch_line())
    assert arguments == {'model_path': 'tiny', 'unnorm_key': 'bridge_orig',
                         'restrict_to_action_tokens': 'true'}
    assert graph.parameter('model_path') == 'tiny'
    assert graph.parameter('unnorm_key') == 'bridge_orig'
    # Without it the random weights' greedy token is rarely an action token: every frame
    # would get a zero twist (invalid action).
    assert graph.parameter('restrict_to_action_tokens') is True


def test_instruction_from_the_readme_command_and_a_latched_publisher_without_a_qos_warning(
        graph, robot):
    # Published before the node started: delivered when it connected.
    graph.wait_for_parameter('instruction', LATCHED_INSTRUCTION)
    pub = find_command(doc_commands(README), 'ros2', 'topic', 'pub')
    assert pub[:5] == ['ros2', 'topic', 'pub', '--once', f'{NODE}/instruction'], pub
    output = graph.ros2.check(pub, expect='publishing #1')
    graph.wait_for_parameter('instruction', re.search(r"data: '(.*)'", pub[-1]).group(1))
    # Both publishers match a subscription of the node without either side warning.
    assert INCOMPATIBLE_QOS not in robot.output(), robot.output()[-4000:]
    assert INCOMPATIBLE_QOS not in output, output


def test_readme_enable_then_camera_frames_are_answered_with_their_stamps(graph, robot):
    call = find_command(doc_commands(README), 'ros2', 'service', 'call', f'{NODE}/enable')
    start = len(graph.twists.snapshot())
    graph.ros2.check(call, expect=r'success=True')
    assert graph.parameter('enabled') is True
    graph.camera.start()
    try:
        twists = graph.wait_for_actions(5, start)
    finally:
        graph.camera.stop()
    assert not graph.unanswered_stamps(twists), 'twists not stamped with a camera frame'
    assert 'invalid' not in robot.output(), robot.output()[-4000:]


def test_readme_param_set_applies_and_the_cli_refuses_what_is_out_of_range(graph, robot):
    commands, node_doc = doc_commands(README), doc_commands(NODE_DOC)
    graph.ros2.check(find_command(commands, 'ros2', 'param', 'set', NODE, 'relax_threshold'),
                     expect='Set parameter successful')
    assert graph.parameter('relax_threshold') == 7
    # The range, as `ros2 param describe` shows it and `ros2 param set` refuses past it; a
    # load-time parameter refused while running.
    described, refused, load_time = graph.ros2.check_together([
        find_command(commands, 'ros2', 'param', 'describe', NODE),
        find_command(node_doc, 'ros2', 'param', 'set', NODE, 'relax_threshold', '1000'),
        find_command(node_doc, 'ros2', 'param', 'set', NODE, 'device')])
    assert re.search(r'Min value: 0\s+Max value: 255', described), described
    assert 'Setting parameter failed' in refused and 'Min: 0, Max: 255' in refused, refused
    assert 'Setting parameter failed' in load_time and 'device' in load_time, load_time
    assert graph.parameter('relax_threshold') == 7
    assert graph.parameter('device') == 'cpu'


def test_param_dump_loads_back_into_the_running_node(graph, robot, tmp_path):
    """The review's case: the empty lists of config/robot.yaml reached the node unset, `ros2
    param dump` wrote them as null, and loading the dump back refused nine parameters (null
    comes back as the text 'None'). Now every parameter of the node loads back unchanged
    (rclpy's own read-only start_type_description_service aside). rclpy's `param load`
    reads only a file's /** section, so the dump's node key is rewritten to it."""
    dump = graph.ros2.check(['ros2', 'param', 'dump', NODE])
    assert 'null' not in dump, dump
    loadable = tmp_path / 'dump.yaml'
    loadable.write_text(re.sub(r'^\S+:$', '/**:', dump, count=1, flags=re.MULTILINE))
    result = graph.ros2.run(['ros2', 'param', 'load', NODE, str(loadable)])
    failed = [line for line in (result.stdout + result.stderr).splitlines()
              if line.startswith('Set parameter') and not line.endswith('successful')
              and 'start_type_description_service' not in line]
    assert failed == [], result.stdout + result.stderr


def test_sigint_while_the_camera_streams_ends_with_a_zero_twist_last(graph, robot):
    from ros_probe import is_zero

    if graph.parameter('enabled') is not True:
        graph.ros2.check(find_command(doc_commands(README), 'ros2', 'service', 'call',
                                      f'{NODE}/enable'), expect=r'success=True')
    start = len(graph.twists.snapshot())
    graph.camera.start()
    try:
        graph.wait_for_actions(3, start)       # acting when SIGINT comes
        code = robot.interrupt()
    finally:
        graph.camera.stop()
    output = robot.output()
    assert code == 0, output[-4000:]
    assert re.search(r'process has finished cleanly', output), output[-4000:]
    last = graph.last_twist_when_quiet()
    assert is_zero(last), f'the last twist moves the robot: {last.twist}'


def test_a_launch_ended_by_sigterm_takes_its_node_with_it(graph, tmp_path):
    """The review's case: SIGTERM to `ros2 launch` (systemd's and Docker's stop) ends launch
    at once and used to leave the node running under init, still commanding the robot. The
    launch file now has the node stop when launch ends (ros/parent_exit.py)."""
    import signal

    import psutil

    from ros_probe import wait_until

    def running(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    argv = readme_launch_line() + ['node_name:=vla_spec_term']
    with graph.ros2.launch(argv, tmp_path / 'term.log') as launched:
        launched.wait_for_output(r'\[vla_spec_term\]: ready', UP_TIMEOUT)
        pids = launched.node_pids('vla_spec_term')
        assert pids, launched.output()[-4000:]
        assert 'stops when the launching process' in launched.output()
        os.kill(launched.popen.pid, signal.SIGTERM)
        wait_until(lambda: not any(running(pid) for pid in pids), timeout=TIMEOUT,
                   what='the node to end with its launch')


# ---- the managed node: lifecycle:=true ---------------------------------------------------------

def lifecycle_sequence():
    """The docs' managed-node commands (docs/node.md, Managed node), in order."""
    return [argv for _, argv in doc_commands(NODE_DOC, '## Managed (lifecycle) node')]


@pytest.fixture(scope='module')
def managed_graph(tmp_path_factory):
    with _graph(tmp_path_factory, MANAGED_DOMAIN_ID, 'managed') as graph:
        yield graph


def _offer_frames_while_inactive(graph, start):
    """INACTIVE_FRAMES camera frames at 30 Hz to the node's (matched) image subscription: an
    inactive node must not command anything, neither an action nor a hold."""
    from ros_probe import wait_until

    wait_until(lambda: graph.camera.publisher.get_subscription_count() >= 1, timeout=TIMEOUT,
               what='the node\'s image subscription')
    event = threading.Event()
    for _ in range(INACTIVE_FRAMES):
        graph.camera.publish()
        event.wait(1 / 30)
    assert graph.twists.snapshot()[start:] == [], 'an inactive node published a twist'


def test_a_misspelt_argument_is_named_and_a_missing_params_file_ends_launch(graph, tmp_path):
    """`ros2 launch` itself (robot.launch.py's checks run inside launch): the typo is named
    with the argument it nearly spells, and a params_file that does not exist ends the launch
    before any node starts (it used to start the embedded model with every default)."""
    from ros_probe import wait_until

    argv = ['ros2', 'launch', 'vla_spec_ros', 'robot.launch.py', 'model_pth:=tiny',
            f'params_file:={tmp_path / "nonexist.yaml"}']
    with graph.ros2.launch(argv, tmp_path / 'misspelt.log') as launched:
        wait_until(lambda: launched.popen.poll() is not None, timeout=TIMEOUT,
                   what='the launch to end')
        output = launched.output()
    assert launched.popen.returncode != 0, output
    assert 'model_pth:=tiny is not an argument of robot.launch.py' in output, output
    assert 'did you mean model_path?' in output, output
    assert "nonexist.yaml' is not a file" in output, output
    assert 'ready' not in output, output


def test_managed_node_through_the_docs_lifecycle_sequence(managed_graph):
    from ros_probe import is_zero, wait_until

    graph = managed_graph
    argv = readme_launch_line() + ['lifecycle:=true']      # docs/node.md: lifecycle:=true
    sequence = lifecycle_sequence()
    assert sequence[:2] == [['ros2', 'lifecycle', 'set', NODE, 'configure'],
                            ['ros2', 'lifecycle', 'set', NODE, 'activate']], sequence
    expected = {'lifecycle': 'Transitioning successful', 'service': r'success=True',
                'param': 'Set parameter successful'}
    with graph.launch(argv, 'managed') as launched:
        from rclpy.parameter_client import AsyncParameterClient

        client = AsyncParameterClient(graph.probe, NODE)
        assert client.wait_for_services(timeout_sec=UP_TIMEOUT), launched.output()[-4000:]
        assert graph.probe.count_publishers(TWIST_TOPIC) == 0      # unconfigured: no topics
        for command in sequence:
            start = len(graph.twists.snapshot())
            graph.ros2.check(command, expect=expected[command[1]])
            if command[-1] == 'configure':
                _offer_frames_while_inactive(graph, start)
        # The docs' sequence leaves it acting: frames answered with their stamps.
        start = len(graph.twists.snapshot())
        graph.camera.start()
        try:
            twists = graph.wait_for_actions(3, start)
            assert not graph.unanswered_stamps(twists)
            graph.ros2.check(['ros2', 'lifecycle', 'set', NODE, 'deactivate'],
                             expect=expected['lifecycle'])
        finally:
            graph.camera.stop()
        last = graph.last_twist_when_quiet()
        assert is_zero(last), f'deactivated, the last twist moves the robot: {last.twist}'
        _offer_frames_while_inactive(graph, len(graph.twists.snapshot()))
        graph.ros2.check(['ros2', 'lifecycle', 'set', NODE, 'cleanup'],
                         expect=expected['lifecycle'])
        wait_until(lambda: graph.probe.count_publishers(TWIST_TOPIC) == 0, timeout=TIMEOUT,
                   what='cleanup to remove the twist publisher')
        assert launched.interrupt() == 0, launched.output()[-4000:]
    assert INCOMPATIBLE_QOS not in launched.output()
