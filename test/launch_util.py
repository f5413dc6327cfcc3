"""Shared by the launch-file tests: load a launch file as a module, its default argument values,
the `--ros-args` command line launch_ros would build from a node's options (used where
`launch` itself is not installed), a node process stopped the way ROS stops it, and this
package built with colcon once per test process (what `ros2 launch` and `ros2 run` need)."""
import atexit
import importlib.util
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = 'vla_spec_ros'
COLCON_MODULES = ('colcon_core', 'colcon_ros', 'colcon_python_setup_py')
# Top-level paths of the repository that are not part of the package source.
NOT_COPIED = {'.git', 'build', 'install', 'log', '.venv', '.pytest_cache', 'results', 'runs',
              '.dbg'}


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


# ---- colcon -----------------------------------------------------------------------------------

def has_colcon() -> bool:
    return all(importlib.util.find_spec(m) is not None for m in COLCON_MODULES)


def _copy_ignore(directory, names):
    ignored = {n for n in names if n == '__pycache__' or n.endswith('.egg-info')}
    if pathlib.Path(directory) == ROOT:
        ignored |= NOT_COPIED & set(names)
    return ignored


_workspace = None


def colcon_workspace():
    """(workspace, install prefix of the package): this tree copied to `<tmp>/src/vla_spec_ros`
    (nothing is written into the source tree) and built with `colcon build`, once per test
    process; the test files that need an install space share it. Removed at exit."""
    global _workspace
    if _workspace is not None:
        return _workspace
    ws = pathlib.Path(tempfile.mkdtemp(prefix='vla-spec-colcon-'))
    atexit.register(shutil.rmtree, ws, True)
    shutil.copytree(ROOT, ws / 'src' / PACKAGE, ignore=_copy_ignore, symlinks=True)
    env = dict(os.environ, COLCON_HOME=str(ws / 'colcon_home'), COLCON_LOG_PATH=str(ws / 'log'),
               PYTHONDONTWRITEBYTECODE='1')
    argv = [sys.executable, '-c', 'import sys; from colcon_core.command import main; '
            'sys.exit(main())', 'build', '--base-paths', str(ws / 'src'),
            '--build-base', str(ws / 'build'), '--install-base', str(ws / 'install')]
    started = time.monotonic()
    result = subprocess.run(argv, cwd=str(ws), env=env, capture_output=True, text=True,
                            timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert f'Finished <<< {PACKAGE}' in output, output[-6000:]
    print(f'colcon build: {time.monotonic() - started:.1f} s')
    _workspace = ws, ws / 'install' / PACKAGE
    return _workspace


def install_env(ws):
    """The install space's environment, as `. install/setup.sh` leaves it."""
    setup = ws / 'install' / 'setup.sh'
    assert setup.is_file(), 'colcon did not generate install/setup.sh'
    env = dict(os.environ)
    env.pop('AMENT_PREFIX_PATH', None)
    out = subprocess.run(['sh', '-c', f'. "{setup}" >/dev/null && env -0'], env=env,
                         capture_output=True, check=True, timeout=60).stdout
    return dict(item.split('=', 1) for item in out.decode().split('\0') if '=' in item)
