"""Shared by the launch-file tests: load a launch file as a module, its default argument values,
the `--ros-args` command line launch_ros would build from a node's options (used where
`launch` itself is not installed), and a node process stopped the way ROS stops it."""
import importlib.util
import os
import pathlib
import signal
import subprocess
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


class NodeProcess:
    """``with NodeProcess(argv, env=..., cwd=...) as node:`` starts a node process (stdout and
    stderr captured as text). Leaving the block normally stops it with SIGINT and asserts a
    clean exit; an exception kills it instead. ``node.output`` holds what it printed."""

    def __init__(self, argv, **popen_kwargs):
        self.popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, **popen_kwargs)
        self.output = ''

    def __enter__(self) -> 'NodeProcess':
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc_type is None:
                self.popen.send_signal(signal.SIGINT)
                code = self.popen.wait(timeout=30)
                if code != 0:
                    self.output = self.popen.communicate()[0]
                    raise AssertionError(f'the node exited with {code} after SIGINT; it '
                                         f'printed:\n{self.output[-4000:]}')
        finally:
            if self.popen.poll() is None:
                self.popen.kill()
            self.output = self.popen.communicate()[0]
        return False
