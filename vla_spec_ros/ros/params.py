"""ROS 2 parameters of the `vla_spec` node: one table, one mapping function.

Every parameter is declared from `PARAMETERS` (param_table.py) with a default, a description
and a range (the joy_teleop / key_teleop idiom; parameter_declaration.py declares them). The
engine's parameters are derived from EngineConfig's field metadata (config.py `EngineOption`):
their range, default, description and tunability are written once, there; the node's own
parameters are param_table.py's table. `settings_from_parameters` (here) is the single place
where parameter values become the frozen `EngineConfig` and the frozen `NodeSettings`
(node_settings.py). The node calls it through `configuration_from_parameters`, which adds each
robot's own settings: one `Configuration` object, built once at start-up (before anything is
subscribed) and handed as is to the policy loader (its `engine` is the engine's config, no
dict in between) and to the serving; again on every `ros2 param set`, to validate the
proposed values and to apply them.

Parameters are either tunable (applied from the next frame: a request keeps the values it was
submitted with) or load-time (the model is built from them; a runtime change is refused with
`load_time_refusal`'s reason).

Pure Python: rcl_interfaces is imported only inside `declare_parameters`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from vla_spec_ros.config import TUNABLE_ENGINE_FIELDS, EngineConfig
# The table, the settings and the declaration live in their own files; their names stay
# importable from here, where the node and the tests have always found them.
from vla_spec_ros.ros.node_settings import NodeSettings, _check_value, check_value  # noqa: F401
from vla_spec_ros.ros.param_table import (  # noqa: F401
    _OPTIONAL_ENGINE_FIELDS, CHUNK_BLENDS, ENGINE_FIELDS_NOT_EXPOSED, INVALID_CHUNK_RULES,
    LOAD_TIME_PARAMETERS, PARAMETERS, PARAMETERS_BY_NAME, ROBOT_PARAMETERS, TUNABLE_PARAMETERS,
    ParameterSpec, describe_range)
from vla_spec_ros.ros.parameter_declaration import (declare_parameters,  # noqa: F401
                                                    robot_parameter_name)


def robot_settings(node: NodeSettings, values: Mapping[str, Any]) -> dict[str, NodeSettings]:
    """{robot name: its NodeSettings}: the node-wide settings overlaid with the robot's own
    `<robot>.<name>` values present in `values`. A single-robot node gives {'': node}."""
    if not node.robots:
        return {'': node}
    out = {}
    for robot in node.robots:
        changes = {name: values[robot_parameter_name(robot, name)] for name in ROBOT_PARAMETERS
                   if robot_parameter_name(robot, name) in values}
        try:
            out[robot] = dataclasses.replace(node, **changes)
        except ValueError as exc:
            raise ValueError(f'{robot}.{exc}') from None
    _check_unshared(out)
    return out


# What one robot's arm alone may be connected to: a MoveIt Servo (a robot's hold pauses it),
# the tool pose its targets start from, the gripper its goals move.
UNSHARED_CONNECTIONS = {
    'servo_node': 'one MoveIt Servo moves one arm, and a hold of either robot would pause it',
    'tool_pose_topic': 'pose targets would start from the other arm\'s tool',
    'gripper_action_name': 'either robot\'s goals would move the one gripper',
}


def _named(robot: str, name: str, value) -> str:
    return f'{robot}.{name}: {value!r}'


def check_unshared(values: Mapping[str, Mapping[str, Any]], where=_named) -> None:
    """ValueError when two robots name the same non-empty Servo, tool pose topic or gripper
    action (a node-wide value or a launch argument given to several robots, a copied block).
    `values`: {robot: {parameter: value}} (missing parameters count as empty);
    `where(robot, name, value)` starts the message. The node checks its settings so, the
    fleet file its values before anything starts."""
    for name, why in UNSHARED_CONNECTIONS.items():
        owner = {}
        for robot, own in values.items():
            value = own.get(name)
            if value and value in owner:
                raise ValueError(f'{where(robot, name, value)} is also {owner[value]}\'s: '
                                 f'{why}; give each robot its own {name}')
            owner.setdefault(value, robot)


def _check_unshared(robots: Mapping[str, NodeSettings]) -> None:
    """`check_unshared` over the robots' settings, and no two robots with pose targets
    reading their tool pose from one TF transform."""
    check_unshared({robot: {name: getattr(settings, name) for name in UNSHARED_CONNECTIONS}
                    for robot, settings in robots.items()})
    owner = {}          # pose targets from TF: one transform frame_id -> tool_frame per arm
    for robot, settings in robots.items():
        if not settings.pose_targets or settings.tool_pose_topic:
            continue
        pair = (settings.frame_id, settings.tool_frame)
        if pair in owner:
            raise ValueError(f'{robot}.tool_frame: TF {pair[0]} -> {pair[1]} is also '
                             f'{owner[pair]}\'s tool pose: pose targets would start from the '
                             'other arm\'s tool; give each robot its own frame_id or tool_frame')
        owner[pair] = robot


def default_values() -> dict[str, Any]:
    return {spec.name: spec.default for spec in PARAMETERS}


def settings_from_parameters(values: Mapping[str, Any]) -> tuple[EngineConfig, NodeSettings]:
    """The one mapping: parameter values -> (EngineConfig, NodeSettings).

    `values` may omit parameters (their defaults apply); unknown names raise ValueError.
    Integers given for float parameters are accepted (YAML `1` for `1.0`).
    """
    per_robot = {robot_parameter_name(r, n) for r in values.get('robots') or ()
                 for n in ROBOT_PARAMETERS}
    unknown = sorted(set(values) - set(PARAMETERS_BY_NAME) - per_robot)
    if unknown:
        raise ValueError(f'unknown parameters {unknown}; known: {sorted(PARAMETERS_BY_NAME)}')
    merged = default_values()
    merged.update((k, v) for k, v in values.items() if k in PARAMETERS_BY_NAME)
    engine, node = {}, {}
    for spec in PARAMETERS:
        value = _check_value(spec, merged[spec.name])
        (engine if spec.target == 'engine' else node)[spec.name] = value
    for name in _OPTIONAL_ENGINE_FIELDS:      # '' stands for None in a string parameter
        engine[name] = engine[name] or None
    engine['max_streams'] = max(1, len(node['robots']))     # one engine stream per robot
    return EngineConfig.from_dict(engine), NodeSettings(**node)


@dataclass(frozen=True)
class Configuration:
    """Everything the parameters decide, as one object: the engine's config, the node-wide
    settings and each robot's own (`robot_settings`; {'': node} for a single robot)."""

    engine: EngineConfig
    node: NodeSettings
    robots: Mapping[str, NodeSettings]


def configuration_from_parameters(values: Mapping[str, Any]) -> Configuration:
    """The node's configuration from its parameter values (`settings_from_parameters`, then
    each robot's `<robot>.<name>` overlay); ValueError naming the first bad parameter."""
    engine, node = settings_from_parameters(values)
    return Configuration(engine, node, robot_settings(node, values))


def default_node_settings() -> NodeSettings:
    return settings_from_parameters({})[1]


def load_time_refusal(name: str) -> str:
    """The reason given when a load-time parameter is set at runtime."""
    return (f'{name} is a load-time parameter: the node reads it once, at start-up; set it '
            'in the params file or as a launch argument and restart the node')


def change_refusal(name: str, value: Any, is_deletion: bool, current: Mapping[str, Any],
                   robots: tuple) -> str | None:
    """Why one parameter change is refused whatever the node's state (plain, managed and
    unconfigured alike), or None: a deletion (`ros2 param delete`: list parameters are
    dynamically typed, so rclpy would undeclare one; a deleted joint_max_velocity read as no
    limit, and no `set` could bring it back), and, on a node serving `robots`, a node-wide
    value of a robot's own parameter (set, it was accepted and then ignored)."""
    if is_deletion:
        return (f'{name}: the parameters of this node cannot be deleted (it would read the '
                'parameter as unset and the name could not be set again); set [] or \'\' '
                'to clear a list or a text')
    if robots and name in ROBOT_PARAMETERS and value != current.get(name):
        return (f'{name}: this node serves robots {list(robots)}; set <robot>.{name} (the '
                'node-wide value is only their default at start-up)')
    return None


def tunable_engine_changes(old: EngineConfig, new: EngineConfig) -> dict[str, Any]:
    """Engine tunables whose values differ, for `Engine.set_tunables(**changes)`."""
    return {name: getattr(new, name) for name in TUNABLE_ENGINE_FIELDS
            if getattr(old, name) != getattr(new, name)}


__all__ = ['check_unshared',
           'ParameterSpec', 'PARAMETERS', 'PARAMETERS_BY_NAME', 'TUNABLE_PARAMETERS',
           'LOAD_TIME_PARAMETERS', 'ENGINE_FIELDS_NOT_EXPOSED', 'NodeSettings',
           'settings_from_parameters', 'Configuration', 'configuration_from_parameters',
           'default_values', 'default_node_settings',
           'load_time_refusal', 'tunable_engine_changes', 'describe_range',
           'declare_parameters', 'ROBOT_PARAMETERS', 'robot_parameter_name',
           'robot_settings']
