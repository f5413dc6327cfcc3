"""The `vla_spec` node: camera + instruction in, TwistStamped + gripper out, for one robot or
several on one engine.

A thin adapter over the engine's streaming interface (the ros2/examples idioms):

  params.py        every parameter, declared with a range; one mapping onto EngineConfig +
                   NodeSettings (+ each robot's own settings)
  robot_channel.py one robot's topics, services and holds; its parts: observation_input.py,
                   safety_gate.py, chunk_execution.py, output_adapter.py and one adapter per
                   output (twist_output.py, gripper_output.py, pose_output.py)
  worker.py        the inference thread: newest frame of each robot -> engine -> channels
  chunk_schedule.py, step_clock.py
                   a chunked model's steps, one per control period (docs/chunks.md)
  serving.py       channels + worker + timers + parameter callbacks of a loaded node
  node.py          this file: load the model, build the serving, `main`
  lifecycle_node.py the same as a managed (lifecycle) node

Topics of a single-robot node (the default): ~/image or ~/image/compressed, ~/instruction in;
~/twist, ~/gripper, ~/action (+ ~/velocity_trajectory, formerly ~/trajectory, for a chunked
model; + ~/pose_target, ~/pose_trajectory with pose_targets) out; ~/enable, ~/reset services;
with servo_node, MoveIt Servo's contract (servo_contract.py). With `robots: [a, b]` each
robot has a/image, a/instruction, a/twist, ... and a.enabled, a.frame_id, ... parameters.
/diagnostics carries one status per robot.
"""
from __future__ import annotations

import sys
from dataclasses import asdict

import rclpy
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException
from rclpy.node import Node

from vla_spec_ros.ros import params
from vla_spec_ros.ros.serving import Serving


def load_policy(settings: params.NodeSettings, engine_config):
    """VLAPolicy.from_pretrained(model_path, **EngineConfig fields); torch imports here."""
    from vla_spec_ros.policy import VLAPolicy

    return VLAPolicy.from_pretrained(settings.model_path, **asdict(engine_config))


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


def load_for_node(node, values: dict, policy=None):
    """Validate the parameter values, set the process's torch threads (``torch_threads``),
    then load the policy (unless one is given)."""
    engine_config, settings = params.settings_from_parameters(values)
    params.robot_settings(settings, values)          # each robot's own values, validated
    if settings.torch_threads:
        import torch
        torch.set_num_threads(settings.torch_threads)
    if policy is None:
        node.get_logger().info(f'loading {settings.model_path!r} (mode {engine_config.mode}, '
                               f'device {engine_config.device})')
        return load_policy(settings, engine_config)
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
        # 2. Model, then the robots' channels, the worker and the timers.
        self._serving = Serving(self, load_for_node(self, values, policy), values,
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

    def destroy_node(self):
        # A node whose construction failed (bad parameters, a checkpoint that does not load)
        # has nothing to stop; its context still destroys it at shutdown.
        serving = getattr(self, '_serving', None)
        if serving is not None:
            serving.destroy()          # stops the worker, closes recordings
        return super().destroy_node()


def run(node_factory, name: str, args=None) -> int:
    """Spin the node `node_factory()` builds until Ctrl-C or shutdown; exit code 1 with a
    message on bad parameters or a checkpoint that does not load."""
    rclpy.init(args=args)
    node = None
    try:
        node = node_factory()
        rclpy.spin(node)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ValueError, ParameterException) as exc:   # bad parameters or checkpoint
        print(f'{name}: {exc}', file=sys.stderr)
        return 1
    except Exception:
        # Ctrl-C shuts the context down from the signal handler; a timer callback already
        # running (the watchdog publishing its zero twist) then fails on the invalid context.
        # That is the shutdown, not a fault: only an error while the context is up is one.
        if rclpy.ok():
            raise
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


def main(args=None) -> int:
    """`vla-spec-node [--ros-args --params-file config/robot.yaml ...]`."""
    return run(VLASpecNode, 'vla_spec', args)


if __name__ == '__main__':
    sys.exit(main())
