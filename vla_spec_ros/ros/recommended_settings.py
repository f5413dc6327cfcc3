"""Node settings a checkpoint recommends, taken unless the user set them.

A checkpoint may say how the node should run it: the blend its chunks measured best with, its
ensemble decay. It says so in ``vla_spec_node.json`` beside its weights
(``{"recommended": {"chunk_blend": "ensemble"}}``, written by whoever measured it); without
that file its family's recommendation stands (models/family.py ``node_settings``: pi0-FAST's
``chunk_blend: ensemble``). At start-up, before the configuration is built, each recommended
parameter the user did not set (no override from the command line, a params file or a launch
file, node-wide or ``<robot>.<name>``) takes the recommended value; the log says, for each,
which value is used and why. A run-time ``ros2 param set`` changes it as any parameter.

Only node parameters may be recommended (a checkpoint cannot change the engine's load-time
options behind the user's back); an unknown name or a value the parameter refuses is an error
naming the file.
"""
from __future__ import annotations

import json
from pathlib import Path

from vla_spec_ros.ros import params

RECOMMENDATIONS_FILE = 'vla_spec_node.json'

# What the shipped params file (config/robot.yaml) leaves unset, listed there only as comments:
# a value in a params file counts as the user's, so a file that set these would override every
# checkpoint's recommendation (pi0-FAST's measured chunk_blend: ensemble) without anyone having
# chosen to. Unset, the node takes the checkpoint's value, else the parameter's default.
LEFT_TO_THE_CHECKPOINT = ('chunk_blend', 'chunk_ensemble_decay')


def checkpoint_recommendations(folder: Path) -> tuple[dict, str]:
    """({parameter: value}, where it comes from) for the checkpoint in ``folder``."""
    path = Path(folder) / RECOMMENDATIONS_FILE
    if path.is_file():
        try:
            recommended = json.loads(path.read_text()).get('recommended', {})
        except (json.JSONDecodeError, AttributeError) as exc:
            raise ValueError(f'{path}: not a JSON object with "recommended" ({exc})') from exc
        source = str(path)
    else:
        from vla_spec_ros.models import registry
        recommended = dict(registry.family_of_folder(folder).node_settings)
        source = 'its model family'
    for name, value in recommended.items():
        spec = params.PARAMETERS_BY_NAME.get(name)
        if spec is None or spec.target != 'node':
            raise ValueError(f'{source}: {name!r} is not a node parameter a checkpoint may '
                             'recommend')
        try:
            params.check_value(spec, value)
        except ValueError as exc:
            raise ValueError(f'{source}: {exc}') from exc
    return dict(recommended), source


def user_given(node) -> set[str]:
    """Parameter names the user set: at start-up (rclpy's overrides: command line, params
    file, launch file) and, on a managed node, with `ros2 param set` before its configure."""
    return set(getattr(node, '_parameter_overrides', {})) | set(
        getattr(node, 'set_before_configure', ()))


def apply_recommendations(node, values: dict, recommended: dict, source: str) -> dict:
    """``values`` with each recommended parameter the user did not set replaced, node-wide
    and for each robot that did not set its own (the node's declared parameters follow);
    logs what is used for each recommendation."""
    from rclpy.parameter import Parameter

    given, log = user_given(node), node.get_logger()
    values = dict(values)
    changes = []
    for name, value in recommended.items():
        names = [name] + [params.robot_parameter_name(robot, name)
                          for robot in values.get('robots', ())
                          if name in params.ROBOT_PARAMETERS]
        # A robot without its own value follows a node-wide value the user set.
        taken = [] if name in given else [n for n in names if n not in given]
        for n in taken:
            values[n] = value
            changes.append(Parameter(n, value=value))
        if name in given:
            log.info(f'{name}: {values[name]!r} as set (the checkpoint recommends {value!r}, '
                     f'{source})')
        else:
            log.info(f'{name}: {value!r}, recommended by the checkpoint ({source}); set '
                     f'{name} to override')
    if changes:
        node.set_parameters(changes)
    return values


__all__ = ['LEFT_TO_THE_CHECKPOINT', 'RECOMMENDATIONS_FILE', 'apply_recommendations',
           'checkpoint_recommendations', 'user_given']
