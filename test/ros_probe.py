"""A probe node for the integration tests: publishers, recorders and ROS clients aimed at one
node under test (rclpy over real DDS; nothing of rclpy is mocked)."""
import contextlib
import os
import threading
import time
import traceback

import numpy as np
import rclpy
from geometry_msgs.msg import TwistStamped
from rclpy.executors import MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.parameter import Parameter, parameter_value_to_python
from rclpy.parameter_client import AsyncParameterClient
from rcl_interfaces.msg import Log
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage, Image
from std_msgs.msg import Float64MultiArray, String
from std_srvs.srv import SetBool, Trigger

from vla_spec_ros.image_messages import array_to_image

TIMEOUT = 20.0


def spin_keeping_errors(executor, stop: threading.Event) -> None:
    """`executor.spin()`, except that an exception a callback raised is printed and appended
    to `executor.callback_errors` instead of ending the thread. rclpy's spin re-raises it,
    and a module's shared graph would then answer nothing for every later test (a node
    destroyed at a test's end while one of its callbacks still runs is enough); a test that
    cares asserts the list is empty (`assert_no_callback_errors`)."""
    while not stop.is_set() and executor.context.ok():
        try:
            executor.spin_once(timeout_sec=0.1)
        except Exception as exc:          # noqa: BLE001 - kept, printed, the spin goes on
            if stop.is_set() or not executor.context.ok():
                return
            executor.callback_errors.append(exc)
            traceback.print_exception(exc)


def assert_no_callback_errors(executor, since: int = 0) -> None:
    """No callback of `executor` (a ros_graph's) raised after its `since`-th error."""
    errors = executor.callback_errors[since:]
    assert not errors, ('a callback raised: '
                        + '; '.join(f'{type(e).__name__}: {e}' for e in errors))


@contextlib.contextmanager
def ros_graph(domain_id: int, probe_name: str, num_threads: int = 1):
    """An isolated graph (its own domain, localhost discovery, a private Context) with an
    executor spinning a probe node on a thread; yields (context, executor, probe_node)."""
    os.environ['ROS_DOMAIN_ID'] = str(domain_id)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=domain_id)
    executor = (SingleThreadedExecutor(context=context) if num_threads == 1
                else MultiThreadedExecutor(num_threads=num_threads, context=context))
    executor.callback_errors = []
    stop = threading.Event()
    thread = threading.Thread(target=spin_keeping_errors, args=(executor, stop), daemon=True)
    probe_node = Node(probe_name, context=context)
    executor.add_node(probe_node)
    thread.start()
    try:
        yield context, executor, probe_node
    finally:
        stop.set()
        executor.shutdown()
        thread.join(timeout=5.0)          # before the node is destroyed (TopicProbe.close)
        probe_node.destroy_node()
        rclpy.shutdown(context=context)


@contextlib.contextmanager
def ros_domain_environment(domain_id: int):
    """ROS_DOMAIN_ID and localhost-only discovery for what runs inside (nodes a harness makes
    in its own Context read them); the previous values are restored after."""
    keys = ('ROS_DOMAIN_ID', 'ROS_AUTOMATIC_DISCOVERY_RANGE')
    saved = {key: os.environ.get(key) for key in keys}
    os.environ['ROS_DOMAIN_ID'] = str(domain_id)
    os.environ['ROS_AUTOMATIC_DISCOVERY_RANGE'] = 'LOCALHOST'
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class TopicProbe:
    """A node of its own Context, spun on its own thread, keeping `convert(msg, node)` of every
    message on one topic (in arrival order)."""

    def __init__(self, name: str, msg_type, topic: str, qos, convert):
        self.context = rclpy.Context()
        rclpy.init(context=self.context)
        self.node = Node(name, context=self.context)
        self.items, self._lock, self._convert = [], threading.Lock(), convert
        self.node.create_subscription(msg_type, topic, self._record, qos)
        self.executor = SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _record(self, msg):
        item = self._convert(msg, self.node)
        with self._lock:
            self.items.append(item)

    def snapshot(self) -> list:
        with self._lock:
            return list(self.items)

    def close(self):
        # The spin thread ends before the node is destroyed: a callback still running against
        # a destroyed node fails, and its future reports the error on stderr at exit.
        self.executor.shutdown()
        self.thread.join(timeout=5.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)


def call_until_answered(client, request, retry_s: float, timeout: float = TIMEOUT,
                        what: str = 'the service'):
    """The answered future of ``client.call_async(request)``, sent again whenever
    ``retry_s`` pass unanswered. A server that was killed lingers in discovery beside its
    replacement, so a request can go out before the new server has matched the client and be
    lost (volatile): for an idempotent call, resending is the cure."""
    deadline = time.monotonic() + timeout
    while True:
        future = client.call_async(request)
        sent = time.monotonic()
        while not future.done() and time.monotonic() - sent < retry_s:
            time.sleep(0.002)
        if future.done():
            return future
        client.remove_pending_request(future)
        if time.monotonic() > deadline:
            raise AssertionError(f'{what} never answered within {timeout} s')


def wait_until(predicate, timeout=TIMEOUT, what='condition'):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.005)
    raise AssertionError(f'timed out after {timeout} s waiting for {what}')


class Recorder:
    """Subscription callback keeping (probe clock seconds, message) pairs."""

    def __init__(self, clock):
        self._clock = clock
        self._lock = threading.Lock()
        self.items = []

    def __call__(self, msg):
        with self._lock:
            self.items.append((self._clock.now().nanoseconds * 1e-9, msg))

    def snapshot(self):
        with self._lock:
            return list(self.items)

    def find(self, predicate, start=0):
        """The first (time, message) after index `start` that satisfies `predicate`, or None."""
        for t, msg in self.snapshot()[start:]:
            if predicate(msg):
                return t, msg
        return None

    def wait_for(self, predicate, start=0, timeout=TIMEOUT, what='message'):
        return wait_until(lambda: self.find(predicate, start), timeout, what)


class LogProbe:
    """A node's log lines, read from /rosout: reliable and transient-local as rcl publishes it,
    so no line is lost, those logged before the probe matched included (reading the process's
    captured stderr while the node writes to it from other threads can drop a line)."""

    def __init__(self, probe_node, node_name: str, lines: Recorder | None = None):
        self.node_name = node_name
        self._node = probe_node
        self._sub = None
        if lines is None:
            lines = Recorder(probe_node.get_clock())
            self._sub = probe_node.create_subscription(Log, '/rosout', lines, QoSProfile(
                depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                durability=DurabilityPolicy.TRANSIENT_LOCAL))
        self.lines = lines

    def for_node(self, node_name: str) -> 'LogProbe':
        """The lines of another node, read by this probe's subscription (a module shares
        one: destroying a subscription while the executor spins can raise InvalidHandle in
        the executor's thread, and /rosout is busy)."""
        return LogProbe(self._node, node_name, self.lines)

    def close(self) -> None:
        """Destroys the subscription (not a view's): only where no error of the probe's
        executor is asserted (see for_node)."""
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
            self._sub = None

    def mark(self) -> int:
        return len(self.lines.snapshot())

    def find_with_time(self, *words, start=0):
        """(probe clock seconds, Log) of the first line after index `start` that contains
        every one of `words`, or None."""
        return self.lines.find(lambda m: m.name == self.node_name and all(
            w in m.msg for w in words), start)

    def find(self, *words, start=0):
        found = self.find_with_time(*words, start=start)
        return None if found is None else found[1]

    def wait_for(self, *words, start=0, timeout=30.0):
        return wait_until(lambda: self.find(*words, start=start), timeout,
                          f'a log line of {self.node_name} with {words}')

    def text(self) -> str:
        """Every line of the node seen so far, one per line (for a failure's message)."""
        return '\n'.join(m.msg for _, m in self.lines.snapshot() if m.name == self.node_name)


def stamp_s(stamp):
    return stamp.sec + 1e-9 * stamp.nanosec


def turn_rate(rpy, period, scale=1.0):
    """The twist's angular velocity for an action's fixed-axis angles (docs/robot.md,
    "Rotations"): the rotation vector of Rz @ Ry @ Rx over the period, by scipy (not the node's
    own rotation math)."""
    from scipy.spatial.transform import Rotation
    return Rotation.from_euler('xyz', np.asarray(rpy, dtype=np.float64)).as_rotvec() \
        / period * scale


def is_zero(twist_msg):
    t = twist_msg.twist
    return all(v == 0.0 for v in (t.linear.x, t.linear.y, t.linear.z,
                                  t.angular.x, t.angular.y, t.angular.z))


def twist_values(twist_msg):
    t = twist_msg.twist
    return np.array([t.linear.x, t.linear.y, t.linear.z, t.angular.x, t.angular.y, t.angular.z])


class Probe:
    """The test's own node: publishers, recorders and ROS clients for one node under test."""

    def __init__(self, node, target, transport='raw', node_name=None):
        """`target`: the topic prefix ('vla_spec' for ~/ topics, a robot name for robot
        topics); `node_name`: the node whose parameters `set_param` changes (default target)."""
        self.node = node
        qos = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        msg_type = CompressedImage if transport == 'compressed' else Image
        topic = f'/{target}/image' + ('/compressed' if transport == 'compressed' else '')
        self.image_pub = node.create_publisher(msg_type, topic, qos)
        self.instruction_pub = node.create_publisher(String, f'/{target}/instruction', latched)
        self.twists = Recorder(node.get_clock())
        self.grippers = Recorder(node.get_clock())
        self.actions = Recorder(node.get_clock())
        self._twist_sub = node.create_subscription(TwistStamped, f'/{target}/twist', self.twists,
                                                   qos)
        node.create_subscription(Float64MultiArray, f'/{target}/gripper', self.grippers, qos)
        node.create_subscription(Float64MultiArray, f'/{target}/action', self.actions, qos)
        self.enable_client = node.create_client(SetBool, f'/{target}/enable')
        self.reset_client = node.create_client(Trigger, f'/{target}/reset')
        self.params = AsyncParameterClient(node, f'/{node_name or target}')

    def now(self):
        return self.node.get_clock().now()

    def call(self, client, request):
        assert client.wait_for_service(timeout_sec=TIMEOUT)
        future = client.call_async(request)
        wait_until(future.done, what=f'{client.srv_name} response')
        return future.result()

    def set_param(self, name, value):
        assert self.params.wait_for_services(timeout_sec=TIMEOUT)
        future = self.params.set_parameters([Parameter(name, value=value)])
        wait_until(future.done, what=f'set {name}')
        return future.result().results[0]

    def delete_param(self, name):
        """`ros2 param delete`: the node's SetParametersResult for it."""
        assert self.params.wait_for_services(timeout_sec=TIMEOUT)
        future = self.params.delete_parameters([name])
        wait_until(future.done, what=f'delete {name}')
        return future.result().results[0]

    def get_param(self, name):
        future = self.params.get_parameters([name])
        wait_until(future.done, what=f'get {name}')
        return parameter_value_to_python(future.result().values[0])

    def send(self, msg, until, timeout=TIMEOUT, retry_s=0.25, restamp=False):
        """Publish `msg` (re-publishing every `retry_s`: the node's best-effort image
        subscription may drop it, and a re-published image must still be younger than the
        node's max_action_age to be answered) until `until()`. With `restamp`, each retry
        carries a fresh stamp (written into `msg`, so an `until` that reads `msg`'s stamp
        follows it): for a test that needs an answer, not this exact stamp, and cannot
        afford an image gone stale while the graph was slow.
        First both ends must be matched: the node's image subscription, and its twist publisher
        to our twist subscription (a reliable twist published before that match is not
        delivered, and a re-published image may be too old by then to be answered again)."""
        wait_until(lambda: self.image_pub.get_subscription_count() > 0, what='image subscriber')
        wait_until(lambda: self._twist_sub.get_publisher_count() > 0, what='twist publisher')
        deadline = time.monotonic() + timeout
        first = True
        while time.monotonic() < deadline:
            if restamp and not first:
                msg.header.stamp = self.now().to_msg()
            first = False
            self.image_pub.publish(msg)
            try:
                return wait_until(until, timeout=retry_s)
            except AssertionError:
                continue
        raise AssertionError('no reaction to the published image')

    def raw_image(self, array, encoding='rgb8', padding=0):
        return array_to_image(array, encoding, stamp=self.now().to_msg(), frame_id='camera',
                              row_padding=padding)
