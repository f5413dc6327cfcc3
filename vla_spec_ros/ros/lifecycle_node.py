"""The `vla_spec` node as a managed (lifecycle) node, for stacks that bring drivers up in order.

Transitions (the standard lifecycle services: `ros2 lifecycle set /vla_spec configure`, ...):

  configure   validate the parameters, load the model, warm it up (CUDA graphs are captured
              here when enabled), create the robots' topics and services; nothing is published
  activate    start acting: frames are taken, actions and zero-twist holds are published
  deactivate  publish one zero twist per robot (gripper held) after the last action, drop
              queued frames and every engine request, stop acting
  cleanup     stop the worker, remove the topics and services, free the model
  shutdown    (from any state) stop the worker, one zero twist per robot if active, then as
              cleanup
  error       (a callback raised) zero twist per robot, then as cleanup

`enabled` (the parameter, or `~/enable`, the same switch) may be set in every state: it is kept
and acted on once the node is active. Activation alone publishes actions only where `enabled`
is true (the parameters file, or set before); the node starts disabled otherwise. SIGINT and
SIGTERM end the process as node.py's `run` does (holds last, then exit 0).

A configure that fails (bad parameter, missing or corrupt checkpoint) returns FAILURE with the
reason in the log and leaves the node unconfigured: fix the parameter (every parameter may be
set while unconfigured) and configure again. Parameters are declared in the constructor, so
`ros2 param set` works in every state; load-time ones are refused once configured.
"""
from __future__ import annotations

import contextlib
import gc
import sys

# First: a stop signal during the imports below exits 0 (early_stop.py).
from vla_spec_ros.ros import early_stop  # noqa: F401
from rcl_interfaces.msg import SetParametersResult
from rclpy.lifecycle import LifecycleNode, TransitionCallbackReturn
from rclpy.parameter import Parameter

from vla_spec_ros.engine.result import describe_error
from vla_spec_ros.ros import params
from vla_spec_ros.ros.node import (StoppedWhileLoading, load_for_node,
                                   refuse_unknown_overrides, run, take_recommendations)
from vla_spec_ros.ros.serving import Serving


class VLASpecLifecycleNode(LifecycleNode):
    """Managed variant of VLASpecNode. `policy` may be passed in (tests, embedding); it is then
    used at configure instead of loading `model_path`."""

    def __init__(self, policy=None, *, node_name: str = 'vla_spec', **node_kwargs):
        self._serving: Serving | None = None     # first: a refused parameter below still
        super().__init__(node_name, **node_kwargs)   # leaves a node rclpy can destroy
        self._values = params.declare_parameters(self)
        refuse_unknown_overrides(self)
        self._given_policy = policy
        self._recommended_for = None      # the model_path whose recommendations were taken
        # Parameters the user set while unconfigured: theirs, as start-up overrides are (a
        # checkpoint's recommendation taken at configure must not overwrite them).
        self.set_before_configure: set[str] = set()
        self._taking_recommendations = False
        self._stop_request = None         # run()'s StopRequest: a stop signal ends a load
        self.add_on_set_parameters_callback(self._validate)
        self.add_post_set_parameters_callback(self._apply)
        # `~/enable` (`<robot>/enable`) in every state, as the `enabled` parameter is: the
        # robots' channels exist only while configured, so the node offers the services.
        from std_srvs.srv import SetBool
        self._enable_services = [
            self.create_service(SetBool, f'{robot}/enable' if robot else '~/enable',
                                lambda request, response, robot=robot:
                                self._on_enable_srv(robot, request, response))
            for robot in (tuple(self._values['robots'] or ()) or ('',))]

    def use_stop_request(self, stop) -> None:
        """`run` hands over its StopRequest: SIGINT or SIGTERM while `configure` loads or
        warms up the model ends that load at once (StoppedWhileLoading, which `run` turns
        into exit 0), as for the plain node, instead of after the whole load."""
        self._stop_request = stop

    def _loading(self):
        stop = self._stop_request
        return stop.loading() if stop is not None else contextlib.nullcontext()

    @property
    def serving(self) -> Serving | None:
        return self._serving

    def stop_serving(self, reason: str) -> None:
        """The process is ending: an active node's holds go out last (Serving.stop)."""
        if self._serving is not None:
            self._serving.stop(reason)

    # ---- parameters -----------------------------------------------------------------------

    def _validate(self, changes) -> SetParametersResult:
        if self._serving is not None:
            return self._serving.validate(changes)
        robots = tuple(self._values['robots'] or ())
        for change in changes:
            if change.name not in self._values:
                continue       # use_sim_time and other rclpy-owned parameters
            # Each robot's own parameters (<robot>.<name>) are declared when the node is
            # built: a robot added later would have none (its enable and instruction could
            # not be set), one removed would leave them behind.
            if change.name == 'robots' and list(change.value or []) != list(robots):
                return SetParametersResult(successful=False, reason=(
                    'robots: fixed when the node starts (each robot\'s own parameters are '
                    'declared then); restart the node to serve other robots'))
            refusal = params.change_refusal(
                change.name, change.value, change.type_ == Parameter.Type.NOT_SET,
                self._values, robots)
            if refusal is not None:
                return SetParametersResult(successful=False, reason=refusal)
        proposed = dict(self._values)
        proposed.update((c.name, c.value) for c in changes if c.name in proposed)
        try:
            params.configuration_from_parameters(proposed)
        except ValueError as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _apply(self, changes) -> None:
        for change in changes:
            if change.name in self._values:
                self._values[change.name] = change.value
                if self._serving is None and not self._taking_recommendations:
                    self.set_before_configure.add(change.name)
        if self._serving is not None:
            self._serving.apply(changes)

    def _on_enable_srv(self, robot: str, request, response):
        """`~/enable`: the robot's channel answers while configured; otherwise the
        parameter is set and kept for configure and activate."""
        serving = self._serving
        channel = None if serving is None else next(
            (c for c in serving.channels if c.name == robot), None)
        if channel is not None:
            response.success, response.message = channel.on_enable(bool(request.data))
            return response
        name = params.robot_parameter_name(robot, 'enabled') if robot else 'enabled'
        result = self.set_parameters([Parameter(name, value=bool(request.data))])[0]
        response.success = result.successful
        response.message = (result.reason if not result.successful else
                            ('enabled' if request.data else 'disabled')
                            + ' (the node is not configured: it acts once configured and '
                              'activated)')
        return response

    # ---- transitions ----------------------------------------------------------------------

    def on_configure(self, state) -> TransitionCallbackReturn:
        try:
            if self._recommended_for != self._values['model_path']:
                # Once per model (a later `ros2 param set` of a recommended one stands).
                self._taking_recommendations = True
                try:
                    self._values = take_recommendations(self, self._values,
                                                        self._given_policy)
                finally:
                    self._taking_recommendations = False
                self._recommended_for = self._values['model_path']
            config = params.configuration_from_parameters(self._values)
            with self._loading():
                policy = load_for_node(self, config, self._given_policy)
            serving = Serving(self, policy, self._values, config, is_active=False,
                              enable_services=False)
        except Exception as exc:   # bad parameters, a checkpoint, out of memory...: say why
            self.get_logger().error(f'configure failed: {describe_error(exc)}')
            return TransitionCallbackReturn.FAILURE
        try:
            with self._loading():
                serving.warm_up()
        except StoppedWhileLoading:
            serving.destroy()
            raise
        except Exception as exc:
            serving.destroy()
            self.get_logger().error(f'configure failed in warm-up: {describe_error(exc)}')
            return TransitionCallbackReturn.FAILURE
        self._serving = serving
        self.get_logger().info(f'configured: mode {policy.engine.config.mode}')
        return TransitionCallbackReturn.SUCCESS

    def on_activate(self, state) -> TransitionCallbackReturn:
        self._serving.set_active(True)
        self.get_logger().info('active: acting on frames')
        return TransitionCallbackReturn.SUCCESS

    def on_deactivate(self, state) -> TransitionCallbackReturn:
        self._serving.set_active(False, 'deactivated')
        self.get_logger().info('inactive: zero twist published, not acting')
        return TransitionCallbackReturn.SUCCESS

    def on_cleanup(self, state) -> TransitionCallbackReturn:
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def on_shutdown(self, state) -> TransitionCallbackReturn:
        self.stop_serving('shutting down')
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def on_error(self, state) -> TransitionCallbackReturn:
        """A transition raised: hold every robot (where its outputs still exist), free the
        model, and go back to unconfigured. Nothing here may raise: rclpy would finalize
        the node, with its model still loaded, and only a restart would recover."""
        self.get_logger().error('error in a transition: zero twist, model freed')
        if self._serving is not None:
            try:
                for channel in self._serving.channels:
                    channel.is_active = True      # let the zero through, then stop
                self._serving.set_active(False, 'lifecycle error')
            except Exception as exc:    # a cleanup failed midway: its outputs may be gone
                self.get_logger().error(f'hold after the error failed: {describe_error(exc)}')
        self._free()
        return TransitionCallbackReturn.SUCCESS

    def _free(self) -> None:
        """Let go of the serving and its model, even when destroying it fails midway (the
        failure is logged; what could not be destroyed goes with the node)."""
        serving, self._serving = self._serving, None
        if serving is None:
            return
        try:
            serving.destroy()
        except Exception as exc:
            self.get_logger().error(f'freeing the model: {describe_error(exc)}')
        finally:
            del serving
            gc.collect()

    def destroy_node(self):
        self._free()
        return super().destroy_node()


def main(args=None) -> int:
    """`vla-spec-lifecycle-node [--ros-args ...]`; starts unconfigured."""
    return run(VLASpecLifecycleNode, 'vla_spec', args, command='vla-spec-lifecycle-node',
               summary='The managed vla_spec node: starts unconfigured; `ros2 lifecycle set '
                       '<node> configure` loads the model, `activate` starts acting '
                       '(docs/node.md).')


if __name__ == '__main__':
    sys.exit(main())
