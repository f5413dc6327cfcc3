"""ROS interface packages the tests need and PyPI does not ship, generated and built here.

control_msgs (GripperCommand, ParallelGripperCommand, JointJog: test/gripper_interface/
control_msgs) and
moveit_msgs (ServoCommandType: test/servo_interface/moveit_msgs) are not on PyPI. Where one is
not installed (a ROS distribution), its interface files, written from upstream's definitions
so the type hashes match, are generated and built with the ROS 2 generators from PyPI
(ament_cmake, rosidl_default_generators: C, C++ and Python code, Fast DDS and introspection
type support), CMake and a C/C++ compiler, into an install prefix cached under the system temp
folder (keyed by the interface files' names and contents, CMakeLists and package.xml
included, and the interpreter: a message added to a package builds a new prefix, never reuses
one built without it). Without that toolchain the caller's
test is skipped and says what is missing.

    prefix = interface_prefix('control_msgs')   # None: installed; else the built prefix
    use_prefix(prefix, 'control_msgs')           # importable in this process
    env = node_env(domain_id, [prefix, ...])     # ... and in a node started as a process
"""
import ctypes
import fcntl
import hashlib
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE_SOURCES = {
    'control_msgs': ROOT / 'test' / 'gripper_interface' / 'control_msgs',
    'moveit_msgs': ROOT / 'test' / 'servo_interface' / 'moveit_msgs',
}
PY_SITE = f'lib/python{sys.version_info[0]}.{sys.version_info[1]}/site-packages'


def ament_prefixes():
    """Prefixes holding ROS packages: AMENT_PREFIX_PATH, and this interpreter's prefix where
    the PyPI ROS wheels install share/ and lib/."""
    prefixes = [p for p in os.environ.get('AMENT_PREFIX_PATH', '').split(os.pathsep) if p]
    if (pathlib.Path(sys.prefix) / 'share' / 'ament_index').is_dir():
        prefixes.append(sys.prefix)
    return prefixes


def missing_toolchain(package_dependencies=('action_msgs',)):
    """What generating an interface package here needs and does not find (empty: all there)."""
    missing = [tool for tool in ('cmake', 'cc', 'c++') if shutil.which(tool) is None]
    for package in ('ament_cmake_core', 'rosidl_default_generators', 'rosidl_core_generators',
                    'rosidl_generator_py', 'rosidl_typesupport_fastrtps_c',
                    *package_dependencies):
        if not any((pathlib.Path(p) / 'share' / package / 'cmake').is_dir()
                   for p in ament_prefixes()):
            missing.append(f'{package} (CMake config)')
    for module in ('catkin_pkg', 'ament_package', 'rosidl_adapter', 'rosidl_parser', 'em',
                   'lark', 'numpy'):
        if importlib.util.find_spec(module) is None:
            missing.append(f'{module} (Python)')
    return missing


def cache_key(source: pathlib.Path) -> str:
    digest = hashlib.sha256(f'{sys.executable}\n{sys.version}\n'.encode())
    for path in sorted(source.rglob('*')):
        if path.is_file():
            digest.update(str(path.relative_to(source)).encode() + path.read_bytes())
    for prefix in ament_prefixes():
        digest.update(prefix.encode())
    return digest.hexdigest()[:16]


def _run(argv, log, env, timeout):
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    with open(log, 'a') as out:
        out.write(' '.join(argv) + '\n' + result.stdout + result.stderr)
    return result


def _dependencies(source: pathlib.Path) -> tuple:
    """The ROS packages the interface package's package.xml depends on."""
    text = (source / 'package.xml').read_text()
    return tuple(line.split('>', 1)[1].split('<', 1)[0] for line in text.splitlines()
                 if line.strip().startswith('<depend>'))


def build_package(name: str) -> pathlib.Path:
    """Install prefix of the generated package `name` (built once; later runs reuse it)."""
    source = PACKAGE_SOURCES[name]
    prefix = pathlib.Path(tempfile.gettempdir()) / f'vla-spec-{name.replace("_", "-")}-' \
        f'{cache_key(source)}'
    if (prefix / 'DONE').is_file():
        return prefix
    missing = missing_toolchain(_dependencies(source))
    if missing:
        pytest.skip(f'{name} is not installed and cannot be generated here: missing '
                    + ', '.join(missing) + ' (pip install -e ".[ros,test]"; cmake, gcc, g++ '
                    'from Debian)')
    with open(f'{prefix}.lock', 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)      # one build at a time on this machine
        if (prefix / 'DONE').is_file():
            return prefix
        staging = pathlib.Path(tempfile.mkdtemp(prefix=f'{prefix.name}.partial-'))
        env = dict(os.environ, AMENT_PREFIX_PATH=os.pathsep.join(ament_prefixes()))
        log = staging / 'build.log'
        # Relative run paths: the prefix is built in a staging folder and then moved.
        configure = ['cmake', '-S', str(source), '-B', str(staging / 'build'),
                     f'-DCMAKE_INSTALL_PREFIX={staging / "install"}',
                     f'-DCMAKE_PREFIX_PATH={";".join(ament_prefixes())}',
                     f'-DPython3_EXECUTABLE={sys.executable}', '-DBUILD_TESTING=OFF',
                     '-DCMAKE_INSTALL_RPATH=$ORIGIN;$ORIGIN/../../..']
        steps = [configure,
                 ['cmake', '--build', str(staging / 'build'), '-j', str(os.cpu_count() or 2)],
                 ['cmake', '--install', str(staging / 'build')]]
        for argv in steps:
            result = _run(argv, log, env, timeout=900)
            if result.returncode != 0:
                text = result.stdout + result.stderr
                if 'Could not find a package configuration file' in text:
                    pytest.skip(f'{name} cannot be generated here: a CMake package of the ROS '
                                f'toolchain is missing; see {log}:\n{text[-1500:]}')
                pytest.fail(f'generating {name} failed ({argv[:2]}); log {log}:\n'
                            f'{text[-4000:]}')
        (staging / 'install' / 'DONE').write_text(log.read_text())
        os.replace(staging / 'install', prefix)
        shutil.rmtree(staging, ignore_errors=True)
    return prefix


def interface_prefix(name: str):
    """None when the package `name` is installed (a ROS distribution), else the prefix it was
    generated into (skips the test when it cannot be generated). A package importable only
    because an earlier test of this process imported it from a generated prefix is not
    installed: a child process needs that prefix on its paths."""
    spec = importlib.util.find_spec(name)
    if spec is not None and not _is_generated(spec):
        return None
    return build_package(name)


def _is_generated(spec) -> bool:
    """Whether a module was imported from a prefix build_package generated."""
    locations = list(spec.submodule_search_locations or []) + [spec.origin or '']
    generated = str(pathlib.Path(tempfile.gettempdir()) / 'vla-spec-')
    return any(str(location).startswith(generated) for location in locations)


def use_prefix(prefix, name: str) -> None:
    """Make a generated package importable in this process (no-op for None).

    rosidl's type support dispatch loads `lib<name>__rosidl_typesupport_*.so` by bare name,
    which the dynamic linker looks up on the LD_LIBRARY_PATH this process started with;
    loading them by path first makes that lookup find them (matched by soname)."""
    if prefix is None:
        return
    for path in sorted((prefix / 'lib').glob(f'lib{name}__*.so')):
        ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    if str(prefix / PY_SITE) not in sys.path:
        sys.path.insert(0, str(prefix / PY_SITE))


def forget_prefix(prefix) -> None:
    if prefix is not None and str(prefix / PY_SITE) in sys.path:
        sys.path.remove(str(prefix / PY_SITE))


def node_env(domain_id: int, prefixes=()):
    """A node process's environment: an isolated domain, this tree first on the path and, for
    each generated prefix (None entries skipped), what its local_setup would add."""
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain_id),
               ROS_AUTOMATIC_DISCOVERY_RANGE='LOCALHOST', PYTHONUNBUFFERED='1')
    paths = {'PYTHONPATH': [str(ROOT)], 'LD_LIBRARY_PATH': [], 'AMENT_PREFIX_PATH': []}
    for prefix in prefixes:
        if prefix is None:
            continue
        paths['PYTHONPATH'].append(str(prefix / PY_SITE))
        paths['LD_LIBRARY_PATH'].append(str(prefix / 'lib'))
        paths['AMENT_PREFIX_PATH'].append(str(prefix))
    for name, first in paths.items():
        env[name] = os.pathsep.join(first + [p for p in env.get(name, '').split(os.pathsep)
                                             if p])
    return env
