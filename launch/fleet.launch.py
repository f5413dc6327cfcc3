"""Launch a fleet of vla_spec engines: one node per GPU or machine, each serving its robots.

    ros2 launch vla_spec_ros fleet.launch.py fleet_file:=/etc/vla/fleet.yaml
    ros2 launch vla_spec_ros fleet.launch.py fleet_file:=... engines:=vla_gpu1   # one machine

`fleet_file` (config/fleet.yaml shows the layout) names the engines, each with its `device`,
its `robots` and its own parameters, the values every engine shares and each robot's own
parameters and topic remappings. Each engine is one `vla-spec-node` with the `robots`
parameter; every engine node runs in the fleet's namespace, so robot `arm0`'s topics are
`/arm0/image`, `/arm0/twist`, ... (or `/<namespace>/arm0/...`) whichever engine serves it.
Engines are started with `respawn` (after `respawn_delay` seconds, at most
`respawn_max_retries` times per engine and launch): a crashed engine comes back and serves its
robots again from their next frames; meanwhile only its robots stop (their controllers see no
command; see docs/fleet.md). An engine refused at start-up (a value only the loaded model can
judge, such as an unnorm_key it does not have) is therefore not restarted for ever.

`engines:=a,b` starts only those engines of the file (one launch per machine, each naming
its own); empty starts them all. `respawn:=false` turns respawning off (debugging).

`launch` and `launch_ros` are imported inside `generate_launch_description` only; the options
of each engine node come from the pure functions `load_fleet` and `engine_options`, which the
tests turn into `vla-spec-node --ros-args ...` where `launch` is not installed.
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
# Installed: share/vla_spec_ros/{launch,config}/; in the source tree: launch/ and config/.
DEFAULT_FLEET_FILE = os.path.normpath(os.path.join(HERE, '..', 'config', 'fleet.yaml'))
DEFAULT_PARAMS_FILE = os.path.normpath(os.path.join(HERE, '..', 'config', 'robot.yaml'))

# (name, default, description). Empty strings mean "not overridden".
ARGUMENTS = (
    ('fleet_file', DEFAULT_FLEET_FILE, 'YAML file of the fleet: engines, their devices and '
     'robots, shared and per-robot parameters'),
    ('engines', '', 'Comma-separated engine names of fleet_file to start here; empty = all'),
    ('respawn', 'true', 'Start a dead engine again after respawn_delay, at most the fleet '
     'file\'s respawn_max_retries times'),
    ('respawn_delay', '', 'Seconds before a dead engine is started again; empty = the '
     'fleet_file value'),
)

# A robot's topic -> the node's own (relative) name of it, `<robot>/<topic>`.
# `velocity_trajectory` (and its former name `trajectory`): the whole chunk of a chunked model
# (MultiDOFJointTrajectory, docs/chunks.md); `pose_target`, `pose_trajectory`: absolute targets
# (pose_targets: true, docs/robot.md); `joint_states` / `state`: the state input
# (state_input), `joint_jog` / `joint_trajectory`: the joint spaces' outputs (action_space,
# docs/action_spaces.md); `reasoning`: a reasoning policy's text. An engine with image_slots
# gives its robots `<slot>/image` and `<slot>/image/compressed` per slot in place of `image`
# and `image/compressed`.
ROBOT_TOPICS = ('image', 'image/compressed', 'instruction', 'twist', 'gripper', 'action',
                'trajectory', 'velocity_trajectory', 'pose_target', 'pose_trajectory',
                'joint_states', 'state', 'joint_jog', 'joint_trajectory', 'reasoning')
SLOT_IMAGE_SUFFIXES = ('/image', '/image/compressed')
# A robot's camera without image_slots; with them, `<slot>/image...` per slot instead.
SINGLE_CAMERA_TOPICS = ('image', 'image/compressed')
FLEET_KEYS = ('namespace', 'params_file', 'respawn_delay', 'respawn_max_retries', 'parameters',
              'engines', 'robots')
ENGINE_KEYS = ('device', 'robots', 'parameters')
DEFAULT_RESPAWN_DELAY = 2.0
# Restarts of one engine per launch (launch counts every restart and never resets the count;
# -1 = no limit). Enough for the rare crash of a long run (an out-of-memory kill, a GPU fault);
# few enough that an engine refused at start-up stops reloading its model after a few tries:
# the node exits 1 both on a bad value (one only the loaded model can judge, such as an
# unnorm_key it does not have) and on a crash, so launch cannot tell them apart.
DEFAULT_RESPAWN_MAX_RETRIES = 5


def _is_name(text) -> bool:
    """A ROS name token: a letter, then letters, digits or _."""
    return (isinstance(text, str) and text[:1].isalpha() and text.isascii()
            and text.replace('_', 'a').isalnum())


def _mapping(value, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValueError(f'{where}: expected a mapping, got {value!r}')
    return value


def _is_slot_image(topic) -> bool:
    """`<slot>/image` or `<slot>/image/compressed`: an image slot's topic (image_slots)."""
    return isinstance(topic, str) and any(
        topic.endswith(suffix) and _is_name(topic[:-len(suffix)])
        for suffix in SLOT_IMAGE_SUFFIXES)


def _unknown(keys, known, where: str) -> None:
    unknown = sorted(set(keys) - set(known))
    if unknown:
        raise ValueError(f'{where}: unknown keys {unknown}; known: {list(known)}')


def _params_module():
    """vla_spec_ros.ros.params, or None where the package is not importable (parameter names
    and values are then left to the node)."""
    try:
        from vla_spec_ros.ros import params
    except ImportError:
        return None
    return params


def _checked_values(values: dict, where: str, *, per_robot: bool = False) -> dict:
    """`values` (name -> value), each name a node parameter (a per-robot one where
    `per_robot`) and each value of its parameter's type and range, checked as the node checks
    it (params.check_value), a YAML int widened to float where the parameter is a float:
    rclpy refuses `1` for a double, and an engine refused at start-up is refused again at
    every respawn. ValueError names `where` and the parameter. Left to the node where the
    package is not importable."""
    params = _params_module()
    if params is None:
        return dict(values)
    _unknown(values, sorted(params.ROBOT_PARAMETERS if per_robot else params.PARAMETERS_BY_NAME),
             where)
    checked = {}
    for name, value in values.items():
        spec = params.PARAMETERS_BY_NAME[name]
        try:
            valid = params.check_value(spec, value)
        except ValueError as exc:
            raise ValueError(f'{where}: {exc}') from None
        widened = isinstance(spec.default, float) or spec.items == 'float'
        checked[name] = (list(valid) if isinstance(valid, tuple) else valid) if widened \
            else value
    return checked


def _params_file_sections(document, prefix: str = ''):
    """(node key, its ros__parameters) of each section of a ROS parameter file, the keys of
    nested namespaces joined by `/` (`cell: {e0: {ros__parameters: ...}}` -> `cell/e0`)."""
    for key, value in (document.items() if isinstance(document, dict) else ()):
        if not isinstance(value, dict):
            continue
        key = f'{prefix}/{key}' if prefix else str(key)
        if 'ros__parameters' in value:
            yield key, value['ros__parameters']
        else:
            yield from _params_file_sections(value, key)


def _params_file_values(path: str, node: str, name: str):
    """The values parameter `name` has in the sections of the ROS parameter file `path` that
    apply to the node `node` (its fully qualified name; keys matched as rcl matches them),
    in file order; None where the file cannot be read here."""
    try:
        import yaml

        from vla_spec_ros.ros.params_files import key_matches
    except ImportError:
        return None
    try:
        with open(path, encoding='utf-8') as handle:
            document = yaml.safe_load(handle)
    except (OSError, ValueError, yaml.YAMLError):
        return None
    return [values[name] for key, values in _params_file_sections(document)
            if key_matches(key, node) and isinstance(values, dict) and name in values]


def _engine_image_slots(values: dict, params_file: str, node: str):
    """The engine's image_slots where they are known before it starts: its fleet-file value
    (`values`: the shared ones and its own), else the one its params file gives it. None
    where neither sets them (the checkpoint may then recommend them, recommended_settings.py),
    the file cannot be read here, or its sections for the node disagree."""
    if 'image_slots' in values:
        slots = values['image_slots']
    else:
        given = _params_file_values(params_file, node, 'image_slots')
        if not given or any(value != given[0] for value in given):
            return None
        slots = given[0]
    slots = [] if slots is None else slots
    if not (isinstance(slots, list) and all(_is_name(slot) for slot in slots)):
        return None                     # not a valid value: the node refuses it itself
    return slots


def _robot_topics(slots: list) -> tuple:
    """The topics (relative to `<robot>/`) a robot of an engine with these image_slots has:
    its camera is `image` without slots, `<slot>/image` for each slot with them."""
    if not slots:
        return ROBOT_TOPICS
    return tuple(t for t in ROBOT_TOPICS if t not in SINGLE_CAMERA_TOPICS) + tuple(
        slot + suffix for slot in slots for suffix in SLOT_IMAGE_SUFFIXES)


def _check_topic_names(topics, slots, where: str) -> None:
    """Each remapped topic is one the robot has (`slots`: its engine's image_slots); where
    the slots are not known at launch (None), any `<slot>/image` name is accepted."""
    if slots is None:
        _unknown([t for t in topics if not _is_slot_image(t)], ROBOT_TOPICS, where)
        return
    known = _robot_topics(slots)
    unknown = sorted(set(topics) - set(known))
    if unknown:
        raise ValueError(f'{where}: unknown keys {unknown}; with its engine\'s image_slots '
                         f'{slots}, known: {list(known)}')


def _node_name(namespace: str, engine: str) -> str:
    """The fully qualified name of an engine's node (`/cell1/e0`, `/e0`)."""
    return '/'.join([''] + [part for part in namespace.split('/') if part] + [engine])


def _params_file(value, fleet_dir: str) -> str:
    """The fleet's `params_file` as an absolute path ('' = none: the package's robot.yaml);
    a relative one is relative to the fleet file's folder `fleet_dir` (not to wherever launch
    runs). ValueError unless it is a file: launch_ros would only warn and start the engines on
    the default values."""
    if value is None or value == '':
        return ''
    if not isinstance(value, str):
        raise ValueError(f'fleet.params_file: expected a file path, got {value!r}')
    path = os.path.join(fleet_dir, os.path.expanduser(value))
    if not os.path.isfile(path):
        raise ValueError(f'fleet.params_file: {path} is not a file (a relative path is '
                         'relative to the fleet file\'s folder)')
    return os.path.normpath(path)


def _check_engine(engine, spec, shared: dict, served: dict) -> dict:
    """One engine of `fleet.engines`: its name, keys, robots (each added to `served`, robot ->
    engine, and served by no other), device and own parameters."""
    where = f'fleet.engines.{engine}'
    if not _is_name(engine):
        raise ValueError(f'{where}: not a valid node name (a letter, then letters, digits '
                         'or _)')
    spec = _mapping(spec, where)
    _unknown(spec, ENGINE_KEYS, where)
    robots = spec.get('robots') or []
    if isinstance(robots, str) or not robots:
        raise ValueError(f'{where}.robots: expected a non-empty list of robot names')
    for robot in robots:
        if not _is_name(robot):
            raise ValueError(f'{where}.robots: {robot!r} is not a valid name')
        if robot in served:
            raise ValueError(f'{where}.robots: {robot} is also served by {served[robot]}; '
                             'each robot needs exactly one engine')
        served[robot] = engine
    own = _mapping(spec.get('parameters'), f'{where}.parameters')
    for key in ('robots', 'device'):
        if key in own or key in shared:
            raise ValueError(f'{where}.parameters: set {key!r} as the engine\'s own key')
    device = spec.get('device')
    if device is not None and not (isinstance(device, str) and device):
        raise ValueError(f'{where}.device: expected cpu, cuda or cuda:N, got {device!r}')
    return {'device': device, 'robots': list(robots),
            'parameters': _checked_values(own, f'{where}.parameters')}


def _check_robot(robot, spec, served: dict, image_slots: dict) -> dict:
    """One robot of `fleet.robots`: served by an engine, its own parameters
    (`<robot>.<name>`) and its topic remappings, each a topic the robot has (`image_slots`:
    engine -> its image_slots, None where not known at launch)."""
    where = f'fleet.robots.{robot}'
    if robot not in served:
        raise ValueError(f'{where}: no engine serves {robot} (served: {sorted(served)})')
    spec = dict(_mapping(spec, where))
    topics = _mapping(spec.pop('topics', None), f'{where}.topics')
    _check_topic_names(topics, image_slots[served[robot]], f'{where}.topics')
    for topic, target in topics.items():
        if not (isinstance(target, str) and target.startswith('/')):
            raise ValueError(f'{where}.topics.{topic}: expected an absolute topic name, '
                             f'got {target!r}')
    values = _checked_values(spec, f'{where} (served by engine {served[robot]})',
                             per_robot=True)
    return {'parameters': values, 'topics': topics}


def check_fleet(data, fleet_dir: str = '') -> dict:
    """The fleet file's `fleet:` mapping, validated: engine and robot names, each robot on
    exactly one engine, per-robot sections only for served robots, known keys, parameter
    names and values (a YAML int made a float where the parameter is one), a params_file
    that exists (relative to `fleet_dir`, the fleet file's folder; '' = the working
    directory). Returns it with every optional key filled in. ValueError names the
    problem."""
    fleet = _mapping(_mapping(data, 'fleet_file').get('fleet'), 'fleet')
    _unknown(fleet, FLEET_KEYS, 'fleet')
    params_file = _params_file(fleet.get('params_file'), fleet_dir or os.getcwd())
    namespace = fleet.get('namespace') or ''
    if namespace and not all(_is_name(part) for part in namespace.strip('/').split('/')):
        raise ValueError(f'fleet.namespace: {namespace!r} is not a valid namespace')
    delay = fleet.get('respawn_delay', DEFAULT_RESPAWN_DELAY)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ValueError(f'fleet.respawn_delay: expected seconds >= 0, got {delay!r}')
    retries = fleet.get('respawn_max_retries', DEFAULT_RESPAWN_MAX_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < -1:
        raise ValueError('fleet.respawn_max_retries: expected a count >= 0 (-1 = no limit), '
                         f'got {retries!r}')
    shared = _mapping(fleet.get('parameters'), 'fleet.parameters')
    engines = _mapping(fleet.get('engines'), 'fleet.engines')
    if not engines:
        raise ValueError('fleet.engines: no engine listed')
    served = {}
    checked_engines = {engine: _check_engine(engine, spec, shared, served)
                       for engine, spec in engines.items()}
    shared = _checked_values(shared, 'fleet.parameters')
    image_slots = {engine: _engine_image_slots(
        dict(shared, **spec['parameters']), params_file or DEFAULT_PARAMS_FILE,
        _node_name(namespace, engine)) for engine, spec in checked_engines.items()}
    robots = _mapping(fleet.get('robots'), 'fleet.robots')
    checked_robots = {robot: _check_robot(robot, spec, served, image_slots)
                      for robot, spec in robots.items()}
    for engine, spec in checked_engines.items():
        _check_unshared(engine, spec, shared, checked_robots)
    return {'namespace': namespace, 'params_file': params_file,
            'respawn_delay': float(delay), 'respawn_max_retries': retries,
            'parameters': shared, 'engines': checked_engines, 'robots': checked_robots}


def _check_unshared(engine: str, spec: dict, shared: dict, robots: dict) -> None:
    """The robots of one engine may not share a Servo, a tool pose topic or a gripper action
    (params.check_unshared, which the node applies at start-up): refused here, before
    anything starts, naming the robots. Values from the params file are the node's to
    check."""
    params = _params_module()
    values = {robot: {**shared, **spec['parameters'],
                      **robots.get(robot, {'parameters': {}})['parameters']}
              for robot in spec['robots']}
    params.check_unshared(values, where=lambda robot, name, value: (
        f'fleet.robots.{robot} (served by engine {engine}): {name} {value!r}'))


def _unique_key_loader():
    """A yaml.SafeLoader that refuses a mapping key given twice. safe_load keeps the last one
    and silently drops the first: an engine, a robot's section or a value would vanish."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            first_lines = {}
            for key_node, _ in node.value:
                if key_node.tag == 'tag:yaml.org,2002:merge':
                    continue            # `<<: *defaults`: its keys may be overridden
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                try:
                    repeated = key in first_lines
                except TypeError:       # an unhashable key: SafeLoader's own error follows
                    continue
                if repeated:
                    raise ValueError(f'line {line}: key {key!r} given twice (first on line '
                                     f'{first_lines[key]}); the later one would silently '
                                     'replace the first')
                first_lines[key] = line
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def load_fleet(path: str) -> dict:
    """Read and check a fleet file (see check_fleet): a key given twice in one mapping is
    refused, naming it and its line; a relative params_file is relative to the file's folder."""
    import yaml

    with open(path, encoding='utf8') as stream:
        try:
            data = yaml.load(stream, Loader=_unique_key_loader())
        except ValueError as exc:
            raise ValueError(f'{path}: {exc}') from None
    return check_fleet(data, os.path.dirname(os.path.abspath(path)))


def selected_engines(fleet: dict, engines_argument: str) -> list:
    """The engines to start here: those named in `engines_argument` (comma-separated), or all
    of them when it is empty; an unknown name, or one named twice, raises ValueError (two
    nodes of one engine would both serve, and command, its robots)."""
    wanted = [name.strip() for name in engines_argument.split(',') if name.strip()]
    unknown = sorted(set(wanted) - set(fleet['engines']))
    if unknown:
        raise ValueError(f'engines: {unknown} not in the fleet file (it has '
                         f'{list(fleet["engines"])})')
    repeated = sorted({name for name in wanted if wanted.count(name) > 1})
    if repeated:
        raise ValueError(f'engines: {repeated} named more than once; each engine runs once '
                         '(two nodes of one engine would both command its robots)')
    return wanted or list(fleet['engines'])


def engine_options(fleet: dict, engine: str, *, respawn: bool = True,
                   respawn_delay: float | None = None) -> dict:
    """The launch_ros Node options of one engine: name, namespace, parameters (the params
    file, then one mapping: shared values, the engine's own, its device and robots, each
    robot's `<robot>.<name>` values), remappings of its robots' topics, respawn (at most
    respawn_max_retries times)."""
    spec = fleet['engines'][engine]
    values = dict(fleet['parameters'])
    values.update(spec['parameters'])
    if spec['device'] is not None:
        values['device'] = spec['device']
    values['robots'] = list(spec['robots'])
    remappings = []
    for robot in spec['robots']:
        own = fleet['robots'].get(robot, {'parameters': {}, 'topics': {}})
        values.update((f'{robot}.{name}', value) for name, value in own['parameters'].items())
        remappings += [(f'{robot}/{topic}', target) for topic, target in own['topics'].items()]
    return {'name': engine, 'namespace': fleet['namespace'],
            'parameters': [fleet['params_file'] or DEFAULT_PARAMS_FILE, values],
            'remappings': remappings, 'respawn': respawn,
            'respawn_delay': fleet['respawn_delay'] if respawn_delay is None else respawn_delay,
            'respawn_max_retries': fleet['respawn_max_retries']}


def fleet_options(values: dict) -> list:
    """Launch argument values (strings) -> the options of every engine to start here."""
    fleet = load_fleet(values['fleet_file'])
    flag = values.get('respawn', 'true').strip().lower()
    if flag not in ('true', 'false'):
        raise ValueError(f'respawn: expected true or false, got {values["respawn"]!r}')
    delay = values.get('respawn_delay', '').strip()
    try:
        delay = float(delay) if delay else None
    except ValueError:
        raise ValueError(f'respawn_delay: expected seconds, got {delay!r}') from None
    if delay is not None and delay < 0:
        raise ValueError(f'respawn_delay: expected seconds >= 0, got {delay}')
    return [engine_options(fleet, engine, respawn=flag == 'true', respawn_delay=delay)
            for engine in selected_engines(fleet, values.get('engines', ''))]


def _launch_takes(keyword: str) -> bool:
    """Whether the installed launch's ExecuteProcess (which launch_ros' Node is) takes
    `keyword`: respawn_max_retries is in launch since Iron (ros2/launch#696), not in Humble's."""
    import inspect

    from launch.actions import ExecuteProcess

    return any(keyword in inspect.signature(cls.__init__).parameters
               for cls in ExecuteProcess.__mro__ if '__init__' in vars(cls))


def _launch_engines(context, *args, **kwargs):
    from launch.actions import LogInfo
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    values = {name: LaunchConfiguration(name).perform(context) for name, _, _ in ARGUMENTS}
    options = fleet_options(values)
    notes = []
    if options and not _launch_takes('respawn_max_retries'):
        notes = [LogInfo(msg='this launch has no respawn_max_retries: a dead engine is '
                             'started again without limit')]
        for engine in options:
            del engine['respawn_max_retries']
    # Each engine stops with this launch process even when it is killed or sent SIGTERM
    # (launch then leaves its nodes running): vla_spec_ros/ros/parent_exit.py.
    from vla_spec_ros.ros.parent_exit import child_env

    return notes + [Node(package='vla_spec_ros', executable='vla-spec-node', output='screen',
                         emulate_tty=True, additional_env=child_env(), **engine)
                    for engine in options]


def generate_launch_description():
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction

    declared = [DeclareLaunchArgument(name, default_value=default, description=description)
                for name, default, description in ARGUMENTS]
    return LaunchDescription(declared + [OpaqueFunction(function=_launch_engines)])
