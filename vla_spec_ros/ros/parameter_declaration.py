"""Declaring the `vla_spec` node's parameters on an rclpy node: each with its description,
range and constraints (what `ros2 param describe` shows), then each robot's own
`<robot>.<name>` defaulting to the node-wide value; empty lists typed so that `ros2 param
dump` writes them back as they load. rcl_interfaces and rclpy import inside.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from vla_spec_ros.ros.node_settings import _check_robot_names
from vla_spec_ros.ros.param_table import (PARAMETERS, PARAMETERS_BY_NAME, ROBOT_PARAMETERS,
                                          describe_range)


def robot_parameter_name(robot: str, name: str) -> str:
    return f'{robot}.{name}'


def declare_parameters(node) -> dict[str, Any]:
    """Declare every parameter on an rclpy node, then each robot's own (`<robot>.<name>`,
    defaulting to the node-wide value); returns {name: value} after overrides."""
    values = _declare(node, PARAMETERS, {})
    robots = _check_robot_names('robots', values['robots'])
    values['robots'] = list(robots)
    robot_specs = [dataclasses.replace(PARAMETERS_BY_NAME[name],
                                       name=robot_parameter_name(robot, name))
                   for robot in robots for name in ROBOT_PARAMETERS]
    defaults = {spec.name: values[spec.name.split('.', 1)[1]] for spec in robot_specs}
    values.update(_declare(node, robot_specs, defaults))
    return values


def _declare(node, specs, defaults) -> dict[str, Any]:
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
    from rclpy.parameter import Parameter

    declared = []
    for spec in specs:
        descriptor = ParameterDescriptor(description=spec.description,
                                         additional_constraints=describe_range(spec))
        default = defaults.get(spec.name, spec.default)
        if isinstance(spec.default, float) and spec.min_value is not None:
            descriptor.floating_point_range = [FloatingPointRange(
                from_value=float(spec.min_value), to_value=float(spec.max_value), step=0.0)]
        elif (isinstance(spec.default, int) and not isinstance(spec.default, bool)
              and spec.min_value is not None):
            descriptor.integer_range = [IntegerRange(
                from_value=int(spec.min_value), to_value=int(spec.max_value), step=1)]
        if isinstance(spec.default, list):
            # rclpy types an empty list as a byte array; dynamic typing lets an override give
            # the string array (checked by settings_from_parameters).
            descriptor.dynamic_typing = True
        declared.append((spec.name, default, descriptor))
    params = node.declare_parameters('', declared)
    # An empty list is typed here: rclpy types [] as a byte array, and an empty YAML list in
    # a params file reaches the node unset, which `ros2 param get` calls "not set" and `ros2
    # param dump` writes as null (loaded back as the text 'None', refused). A typed empty
    # array dumps as [] and loads back.
    empty = [Parameter(p.name, Parameter.Type.DOUBLE_ARRAY if spec.items == 'float'
                       else Parameter.Type.STRING_ARRAY, [])
             for spec, p in zip(specs, params)
             if isinstance(spec.default, list) and not p.value]
    if empty:
        node.set_parameters(empty)
    values = {p.name: p.value for p in params}
    values.update((p.name, []) for p in empty)
    return values
