"""Shared by the launch-file tests: load a launch file as a module, its default argument values,
and the `--ros-args` command line launch_ros would build from a node's options (used where
`launch` itself is not installed)."""
import importlib.util
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_launch_module(file_name: str):
    path = ROOT / 'launch' / file_name
    spec = importlib.util.spec_from_file_location(path.stem.replace('.', '_'), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_values(module, **changes):
    values = {name: default for name, default, _ in module.ARGUMENTS}
    values.update(changes)
    return values


def ros_args_command(module_name: str, options: dict, extra=()):
    """What launch_ros runs for these node options, with this tree's entry-point module."""
    argv = [sys.executable, '-m', module_name, '--ros-args']
    for item in options['parameters']:
        if isinstance(item, dict):
            for key, value in item.items():
                value = str(value).lower() if isinstance(value, bool) else value
                argv += ['-p', f'{key}:={value}']
        else:
            argv += ['--params-file', str(item)]
    for own, topic in options['remappings']:
        argv += ['-r', f'{own}:={topic}']
    argv += ['-r', f'__node:={options["name"]}']
    if options['namespace']:
        argv += ['-r', f'__ns:={options["namespace"]}']
    return argv + list(extra)


def child_env(domain_id: int, **extra):
    """Environment of a child node process: an isolated domain, this tree first on the path."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id),
               ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', PYTHONUNBUFFERED='1', **extra)
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT)] + [p for p in
                                                       [env.get('PYTHONPATH', '')] if p])
    return env
