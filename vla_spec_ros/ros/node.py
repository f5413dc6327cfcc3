"""The `vla_spec` node: camera + instruction in, TwistStamped + gripper out, for one robot or
several on one engine.

A thin adapter over the engine's streaming interface (the ros2/examples idioms):

  params.py        every parameter (param_table.py), declared with a range
                   (parameter_declaration.py); one mapping onto EngineConfig + NodeSettings
                   (node_settings.py) (+ each robot's own settings)
  robot_channel.py one robot's topics, services and holds; its parts: observation_input.py,
                   safety_gate.py (with command_rules.py, the safety decisions),
                   chunk_execution.py, output_adapter.py and one adapter per output
                   (twist_output.py, joint_outputs.py, gripper_output.py,
                   raw_action_output.py, pose_output.py, reasoning_output.py)
  worker.py        the inference thread: newest frame of each robot -> engine -> channels
  chunk_rules.py, chunk_execution.py, chunk_clock.py
                   a chunked model's steps, one per control period (docs/chunks.md): the
                   rules, one robot's chunks, the thread that publishes them on time
  serving.py       channels + worker + timers + parameter callbacks of a loaded node
  node.py          this file: load the model, build the serving, `main`
  lifecycle_node.py the same as a managed (lifecycle) node

Stopping (`run`): SIGINT (Ctrl-C, `ros2 launch`) and SIGTERM end the spin; the node then takes
no frame and publishes no action any more, sends each robot's hold (a zero twist) last, waits
for it to be acknowledged, and the process exits 0 (Serving.stop).

Topics of a single-robot node (the default): ~/image or ~/image/compressed, ~/instruction in;
~/twist, ~/gripper, ~/action (+ ~/velocity_trajectory, formerly ~/trajectory, for a chunked
model; + ~/pose_target, ~/pose_trajectory with pose_targets) out; ~/enable, ~/reset services;
with servo_node, MoveIt Servo's contract (servo_contract.py). With `robots: [a, b]` each
robot has a/image, a/instruction, a/twist, ... and a.enabled, a.frame_id, ... parameters.
/diagnostics carries one status per robot.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

# First: a stop signal during the imports below exits 0 (early_stop.py).
from vla_spec_ros.ros import early_stop
import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from rclpy.signals import SignalHandlerOptions

from vla_spec_ros.ros import params
from vla_spec_ros.ros.parent_exit import stop_with_parent
from vla_spec_ros.ros.robot_recordings import prepare_record_dirs
from vla_spec_ros.ros.serving import Serving

STOP_SIGNALS = early_stop.STOP_SIGNALS      # SIGINT, SIGTERM: the same before and after run
SPIN_PERIOD_S = 0.1      # the spin looks for a stop request at least this often


def load_policy(config: params.Configuration):
    """The policy of `model_path`, its engine running with `config.engine` itself (no copy
    through keyword options); torch imports here."""
    from vla_spec_ros.policy import VLAPolicy

    return VLAPolicy.from_config(config.node.model_path, config.engine)


def refuse_unknown_overrides(node) -> None:
    """rclpy silently ignores overrides of undeclared names; a misspelled key in the params
    file must fail instead."""
    overrides = getattr(node, '_parameter_overrides', {})
    unknown = sorted(name for name in overrides
                     if not node.has_parameter(name) and not name.startswith('qos_overrides.'))
    if unknown:
        raise ValueError(f'unknown parameters {unknown} for node {node.get_name()}; known: '
                         f'{sorted(params.PARAMETERS_BY_NAME)} and, per robot, '
                         f'<robot>.{{{", ".join(params.ROBOT_PARAMETERS)}}}')


def take_recommendations(node, values: dict, policy=None) -> dict:
    """`values` with the node settings the checkpoint recommends, where the user set none
    (recommended_settings.py); the checkpoint is the given policy's, else `model_path`'s."""
    from pathlib import Path

    from vla_spec_ros.ros.recommended_settings import (apply_recommendations,
                                                       checkpoint_recommendations)
    folder = getattr(policy, 'source', None) if policy is not None else None
    if folder is None or not Path(folder).is_dir():
        if policy is not None:
            return values           # a wrapper in tests, no checkpoint folder to read
        from vla_spec_ros.policy import resolve_checkpoint
        folder = resolve_checkpoint(values['model_path'])
    recommended, source = checkpoint_recommendations(Path(folder))
    return apply_recommendations(node, values, recommended, source) if recommended else values


def load_for_node(node, config: params.Configuration, policy=None):
    """Set the process's torch threads (``torch_threads``), then load the policy of the
    validated `config` (unless one is given). The recordings' folders are made first: one
    that cannot be is refused before the model loads."""
    settings, engine_config = config.node, config.engine
    prepare_record_dirs(config.robots)
    if settings.torch_threads:
        import torch
        torch.set_num_threads(settings.torch_threads)
    if policy is None:
        node.get_logger().info(f'loading {settings.model_path!r} (mode {engine_config.mode}, '
                               f'device {engine_config.device})')
        return load_policy(config)
    node.get_logger().info('using the policy passed to the node; load-time engine parameters '
                           'come from it')
    return policy


class VLASpecNode(Node):
    """The ROS 2 adapter. `policy` may be passed in (tests, embedding); else it is loaded."""

    def __init__(self, policy=None, *, node_name: str = 'vla_spec', **node_kwargs):
        super().__init__(node_name, **node_kwargs)
        # 1. Parameters: declare, refuse unknown overrides, validate. All of this happens
        #    before anything is subscribed (a bad file fails here, loudly).
        values = params.declare_parameters(self)
        refuse_unknown_overrides(self)
        values = take_recommendations(self, values, policy)
        config = params.configuration_from_parameters(values)
        # 2. Model, then the robots' channels, the worker and the timers, from that one
        #    configuration object.
        self._serving = Serving(self, load_for_node(self, config, policy), values, config,
                                is_active=True)
        self._serving.warm_up()      # before anything is served: the first action is not slow
        self.add_on_set_parameters_callback(self._serving.validate)
        self.add_post_set_parameters_callback(self._serving.apply)
        settings = self._serving.settings
        robots = ', '.join(settings.robots) if settings.robots else 'one robot'
        self.get_logger().info(
            f'ready: mode {self._serving.engine.config.mode}, {robots}, '
            f'{"enabled" if settings.enabled else "disabled (call enable)"}, '
            f'image transport {settings.image_transport}')

    @property
    def serving(self) -> Serving:
        return self._serving

    def stats_snapshot(self, robot: str = '') -> dict:
        return self._serving.stats_snapshot(robot)

    def stop_serving(self, reason: str) -> None:
        """The process is ending: each robot's hold last (Serving.stop)."""
        self._serving.stop(reason)

    def destroy_node(self):
        # A node whose construction failed (bad parameters, a checkpoint that does not load)
        # has nothing to stop; its context still destroys it at shutdown.
        serving = getattr(self, '_serving', None)
        if serving is not None:
            serving.destroy()          # stops the worker, closes recordings
        return super().destroy_node()


class StoppedWhileLoading(BaseException):
    """A stop signal while the node is built (rclpy's start, the model's load, the warm-up):
    raised in the main thread so that the load ends at once. Not a KeyboardInterrupt: with
    Python's own handler a Ctrl-C during the load could land in a garbage-collector callback,
    which swallows it ("Exception ignored"), and the node then went on to serve, deaf to
    that Ctrl-C; and a KeyboardInterrupt caught here still ended some processes with status
    -2 instead of 0. Not an Exception either, so that no `except Exception` in a library
    swallows it."""


class StopRequest:
    """Set by SIGINT or SIGTERM while `installed()`: the spin ends at its next look and the
    node stops in order, with its context still valid (rclpy's own handler would shut the
    context down inside the signal, so the node could no longer publish its holds). Within
    `loading()` the signal also raises StoppedWhileLoading; where that is swallowed, the
    request stays set and the spin that follows the load ends before it starts."""

    def __init__(self):
        self._event = threading.Event()
        self._loading = False
        self.reason = 'shutting down'

    def is_set(self) -> bool:
        return self._event.is_set()

    def _on_signal(self, number, frame) -> None:
        self.reason = f'shutting down ({signal.Signals(number).name})'
        self._event.set()
        if self._loading:
            raise StoppedWhileLoading(self.reason)

    @contextlib.contextmanager
    def installed(self):
        """The handlers of STOP_SIGNALS, restored after (only the main thread has them)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {number: signal.signal(number, self._on_signal) for number in STOP_SIGNALS}
        try:
            yield
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    @contextlib.contextmanager
    def loading(self):
        """A stop signal within this block ends it with StoppedWhileLoading."""
        if self._event.is_set():
            raise StoppedWhileLoading(self.reason)
        self._loading = True
        try:
            yield
        finally:
            self._loading = False


def spin_until(node, stop: StopRequest) -> None:
    """Spin `node` until `stop` is set or its context is shut down."""
    executor = SingleThreadedExecutor(context=node.context)
    executor.add_node(node)
    try:
        while node.context.ok() and not stop.is_set():
            executor.spin_once(timeout_sec=SPIN_PERIOD_S)
    finally:
        executor.remove_node(node)
        executor.shutdown()


def stop_in_order(node, reason: str) -> None:
    """The node's `stop_serving(reason)` (holds last), while its context can still publish."""
    stop_serving = getattr(node, 'stop_serving', None)
    if stop_serving is not None and node.context.ok():
        stop_serving(reason)


def wants_help(args, ros_args_flag: str = '--ros-args') -> bool:
    """`-h` / `--help` before any `--ros-args` (a node otherwise starts, whatever it is
    given)."""
    argv = list(sys.argv[1:] if args is None else args[1:])
    before = argv[:argv.index(ros_args_flag)] if ros_args_flag in argv else argv
    return any(a in ('-h', '--help') for a in before)


def parameter_help(command: str, summary: str) -> str:
    """The usage of a node entry point and its parameters (name, default, range: what
    `ros2 param describe` says)."""
    lines = [f'usage: {command} [--ros-args --params-file FILE -p NAME:=VALUE -r FROM:=TO ...]',
             '', summary, '', 'parameters (docs/node.md has the full table):']
    for spec in params.PARAMETERS:
        constraints = params.describe_range(spec)
        lines.append(f'  {spec.name} = {spec.default!r}'
                     + (f'  [{constraints}]' if constraints else ''))
        lines.append(f'      {spec.description}')
    return '\n'.join(lines)


def warn_unmatched_params_files(node, argv) -> None:
    """A `--params-file` none of whose node keys names this node was silently not applied
    (params_files.py): say so, naming its keys and the node's name."""
    from vla_spec_ros.ros.params_files import unmatched_params_files

    name = node.get_fully_qualified_name()
    for path, keys in unmatched_params_files(argv, name):
        node.get_logger().warning(
            f'--params-file {path}: its sections {keys} name no node {name}; none of its '
            f'values were applied (use the key {name} or /**)')


def node_name_from_args(args, default: str) -> str:
    """The node name a `-r __node:=<name>` (or `--remap`, `<default>:__node:=`) after
    `--ros-args` gives, the first such rule as in rcl, else `default`: how launch names a
    fleet's engines, so that a start-up error names the engine it stopped."""
    argv = list(sys.argv if args is None else args)
    in_ros_args = False
    for flag, rule in zip(argv, argv[1:] + ['']):
        in_ros_args = flag == '--ros-args' or (in_ros_args and flag != '--')
        if not in_ros_args or flag not in ('-r', '--remap') or ':=' not in rule:
            continue
        target, new_name = rule.split(':=', 1)
        node, _, key = target.rpartition(':')
        if key in ('__node', '__name') and node in ('', default) and new_name:
            return new_name
    return default


def run(node_factory, name: str, args=None, *, command: str = 'vla-spec-node',
        summary: str = 'The vla_spec node.') -> int:
    """Spin the node `node_factory()` builds until SIGINT, SIGTERM or shutdown, then stop it
    in order (`stop_serving`: holds last) and exit 0; exit code 1 with a message on bad
    parameters, arguments ROS cannot parse (a malformed `-p`, a params file missing or not
    YAML) or a checkpoint that does not load. SIGINT or SIGTERM while the model loads ends
    the process at once with 0 (nothing was published yet). `-h` / `--help` prints the
    parameters and exits 0."""
    if wants_help(args):
        print(parameter_help(command, summary))
        return 0
    stop = StopRequest()
    # From here on a stop signal is this function's, whenever it comes (StopRequest).
    with stop.installed():
        if early_stop.received() is not None:      # one came during the imports, and its
            return 0                               # exit was swallowed (early_stop.py)
        try:
            with stop.loading():
                rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
        except StoppedWhileLoading:
            rclpy.try_shutdown()
            return 0
        except Exception as exc:      # rcl's RCLError: "Couldn't parse parameter override ..."
            print(f'{node_name_from_args(args, name)}: {exc}', file=sys.stderr)
            return 1
        return _serve(node_factory, name, args, stop)


def _serve(node_factory, name: str, args, stop: StopRequest) -> int:
    """`run` once rclpy is up: build the node (a stop meanwhile ends the load), spin, stop in
    order; the exit code."""
    node = None
    # Before the model loads: a launch that ends meanwhile ends this process too (nothing
    # was published yet); once spinning, its SIGTERM is handled as any (holds last).
    parent_watch = stop_with_parent()
    try:
        with stop.loading():
            node = node_factory()
        if hasattr(node, 'use_stop_request'):   # a managed node loads its model later, in
            node.use_stop_request(stop)          # configure: a stop ends that load too
        if parent_watch is not None:
            node.get_logger().info(parent_watch)
        warn_unmatched_params_files(node, sys.argv if args is None else args)
        spin_until(node, stop)       # returns at once if a stop came during the load
        stop_in_order(node, stop.reason)
    except StoppedWhileLoading:
        if node is not None:         # the signal came as the load returned
            stop_in_order(node, stop.reason)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ValueError, ParameterException) as exc:   # bad parameters or checkpoint
        label = node.get_name() if node is not None else node_name_from_args(args, name)
        print(f'{label}: {exc}', file=sys.stderr)
        return 1
    except Exception as exc:
        # A context shut down from elsewhere (another thread, an embedding application) makes
        # a callback running then (the watchdog publishing its zero twist) fail on the
        # invalid context. That is the shutdown, not a fault: only an error while the context
        # is up is one, and the robots' holds still go out before it ends the process.
        if rclpy.ok():
            if node is not None:
                try:
                    stop_in_order(node, f'node error: {type(exc).__name__}: {exc}')
                except Exception:
                    pass              # the error below is the one to report
            raise
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


def main(args=None) -> int:
    """`vla-spec-node [--ros-args --params-file config/robot.yaml ...]`."""
    return run(VLASpecNode, 'vla_spec', args, command='vla-spec-node',
               summary='Runs a VLA model on camera frames and publishes robot commands '
                       '(docs/node.md).')


if __name__ == '__main__':
    sys.exit(main())
