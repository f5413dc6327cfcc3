"""ROS 2 parameters of the `vla_spec` node: one table, one mapping function.

Every parameter is declared from `PARAMETERS` with a default, a description and a range
(joy_teleop / key_teleop idiom, STYLE.md item 4). `settings_from_parameters` is the single
place where parameter values become the frozen `EngineConfig` (vla_spec_ros/config.py) and the
frozen `NodeSettings` below; the node calls it at start-up (before it subscribes) and on every
`ros2 param set` to validate the proposed values.

Parameters are either tunable (applied from the next frame, DESIGN.md §8) or load-time (the
model is built from them; a runtime change is refused with `load_time_refusal`'s reason).

Pure Python: rcl_interfaces is imported only inside `declare_parameters`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

from vla_spec_ros.config import DTYPES, MODES, TUNABLE_ENGINE_FIELDS, EngineConfig

IMAGE_TRANSPORTS = ('raw', 'compressed')
STAMP_SOURCES = ('header', 'receipt')

# EngineConfig fields without a parameter, and why.
ENGINE_FIELDS_NOT_EXPOSED = {'max_streams': 'the node serves a single camera stream'}


@dataclass(frozen=True)
class ParameterSpec:
    name: str
    default: Any                      # its Python type is the parameter type
    description: str
    is_tunable: bool
    target: str                       # 'engine' (EngineConfig field) or 'node' (NodeSettings)
    min_value: float | None = None    # inclusive range, numbers only
    max_value: float | None = None
    choices: tuple = ()
    unit: str = ''


def _p(name, default, description, *, tunable, target='node', lo=None, hi=None, choices=(),
       unit=''):
    return ParameterSpec(name, default, description, tunable, target, lo, hi, tuple(choices),
                         unit)


PARAMETERS: tuple[ParameterSpec, ...] = (
    # --- model and engine, load-time -----------------------------------------------------
    _p('model_path', 'tiny', 'Checkpoint folder in OpenVLA\'s Hugging Face layout, or a preset '
       'name', tunable=False),
    _p('draft_path', '', 'EAGLE draft-head folder for the spec modes; empty = none',
       tunable=False, target='engine'),
    _p('mode', 'ar', 'Decoding mode', tunable=False, target='engine', choices=MODES),
    _p('device', 'cpu', 'Torch device: cpu or cuda[:N]', tunable=False, target='engine'),
    _p('dtype', 'float32', 'Model weights and activations dtype', tunable=False,
       target='engine', choices=DTYPES),
    _p('center_crop', False, 'Center-crop (scale 0.9) before resizing; for checkpoints '
       'trained with crop augmentation', tunable=False, target='engine'),
    _p('rotate_180', False, 'Rotate the image by 180 degrees first (LIBERO agent view)',
       tunable=False, target='engine'),
    _p('restrict_to_action_tokens', False, 'Greedy argmax over action tokens only (off = '
       'OpenVLA parity)', tunable=False, target='engine'),
    _p('max_inflight', 7, 'Requests in flight at once in the pipeline modes', tunable=False,
       target='engine', lo=1, hi=64),
    _p('attention_backend', 'auto', 'Packed attention: auto (= segments: each request attends '
       'to its own KV only) or dense (the reference)', tunable=False, target='engine',
       choices=('auto', 'segments', 'dense')),
    _p('use_kernels', 'auto', 'Fused Triton kernels: auto (CUDA only), on or off',
       tunable=False, target='engine', choices=('auto', 'on', 'off')),
    _p('use_cuda_graphs', False, 'CUDA graphs of the packed step, draft forwards and vision '
       'towers (device cuda only)', tunable=False, target='engine'),
    _p('max_instruction_tokens', 128, 'Longest accepted instruction, in tokens',
       tunable=False, target='engine', lo=1, hi=1024),
    _p('seed', 0, 'Seed for anything random in the engine', tunable=False, target='engine',
       lo=0, hi=2 ** 31 - 1),
    # --- speculation, tunable --------------------------------------------------------------
    _p('relax_threshold', 0, 'Relaxed acceptance: accept a draft bin within this many bins '
       'of the verifier (0 = exact)', tunable=True, target='engine', lo=0, hi=255,
       unit='bins'),
    _p('tree_depth', 4, 'Draft tree depth', tunable=True, target='engine', lo=1, hi=16),
    _p('tree_top_k', 8, 'Draft tree top-k per expanded node', tunable=True, target='engine',
       lo=1, hi=32),
    _p('tree_max_nodes', 50, 'Draft tree size, root included', tunable=True, target='engine',
       lo=2, hi=512),
    # --- inputs ----------------------------------------------------------------------------
    _p('image_transport', 'raw', 'Subscribe ~/image (raw) or ~/image/compressed',
       tunable=False, choices=IMAGE_TRANSPORTS),
    _p('instruction', '', 'Language instruction; ~/instruction messages overwrite it',
       tunable=True),
    _p('unnorm_key', '', 'Dataset statistics used to un-normalize actions; empty = the '
       'checkpoint\'s only key', tunable=True),
    # --- outputs ---------------------------------------------------------------------------
    _p('enabled', False, 'Publish actions; false publishes zero twist (also ~/enable)',
       tunable=True),
    _p('frame_id', 'base_link', 'frame_id of ~/twist (MoveIt Servo needs a non-empty one)',
       tunable=True),
    _p('control_period', 0.2, 'Seconds one action delta spans; velocity = delta / '
       'control_period * scale', tunable=True, lo=0.001, hi=10.0, unit='s'),
    _p('linear_scale', 1.0, 'Factor on linear velocities', tunable=True, lo=0.0, hi=10.0),
    _p('angular_scale', 1.0, 'Factor on angular velocities', tunable=True, lo=0.0, hi=10.0),
    _p('max_linear_speed', 0.25, 'Limit on the norm of the linear velocity (direction kept)',
       tunable=True, lo=0.0, hi=10.0, unit='m/s'),
    _p('max_angular_speed', 1.0, 'Limit on the norm of the angular velocity (direction kept)',
       tunable=True, lo=0.0, hi=20.0, unit='rad/s'),
    _p('gripper_binarize', True, 'Snap the gripper value to open / closed at gripper_threshold',
       tunable=True),
    _p('gripper_threshold', 0.5, 'Gripper values at or above this are open', tunable=True,
       lo=0.0, hi=1.0),
    _p('gripper_invert', False, 'Use 1 - value (for checkpoints where 1 means closed)',
       tunable=True),
    _p('gripper_open_position', 1.0, 'Controller command for an open gripper', tunable=True,
       lo=-100.0, hi=100.0),
    _p('gripper_closed_position', 0.0, 'Controller command for a closed gripper',
       tunable=True, lo=-100.0, hi=100.0),
    _p('gripper_action_name', '', 'control_msgs GripperCommand action to also send goals to '
       '(e.g. /gripper_controller/gripper_cmd); empty = none', tunable=False),
    _p('gripper_max_effort', 10.0, 'max_effort of GripperCommand goals', tunable=True, lo=0.0,
       hi=10000.0, unit='N'),
    # --- safety and diagnostics ------------------------------------------------------------
    _p('max_action_age', 0.5, 'Never publish an action whose image is older than this; '
       'publish zero twist instead', tunable=True, lo=0.01, hi=60.0, unit='s'),
    _p('stamp_source', 'header', 'Image age from its header stamp or from its receipt time',
       tunable=True, choices=STAMP_SOURCES),
    _p('num_halt_messages', 4, 'Zero twists published on entering a hold (disabled, stale, '
       'error) before going quiet', tunable=True, lo=1, hi=1000),
    _p('watchdog_period', 0.02, 'Period of the staleness check', tunable=False, lo=0.005,
       hi=1.0, unit='s'),
    _p('diagnostics_period', 1.0, 'Period of /diagnostics messages', tunable=False, lo=0.05,
       hi=60.0, unit='s'),
)

PARAMETERS_BY_NAME = {spec.name: spec for spec in PARAMETERS}
TUNABLE_PARAMETERS = tuple(s.name for s in PARAMETERS if s.is_tunable)
LOAD_TIME_PARAMETERS = tuple(s.name for s in PARAMETERS if not s.is_tunable)


@dataclass(frozen=True)
class NodeSettings:
    """Everything the node needs besides the engine; validated at construction.

    Defaults live only in `PARAMETERS`; `default_node_settings()` builds them.
    """

    model_path: str
    image_transport: str
    instruction: str
    unnorm_key: str
    enabled: bool
    frame_id: str
    control_period: float
    linear_scale: float
    angular_scale: float
    max_linear_speed: float
    max_angular_speed: float
    gripper_binarize: bool
    gripper_threshold: float
    gripper_invert: bool
    gripper_open_position: float
    gripper_closed_position: float
    gripper_action_name: str
    gripper_max_effort: float
    max_action_age: float
    stamp_source: str
    num_halt_messages: int
    watchdog_period: float
    diagnostics_period: float

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = _check_value(PARAMETERS_BY_NAME[field.name], getattr(self, field.name))
            object.__setattr__(self, field.name, value)
        if not self.model_path:
            raise ValueError('model_path: must not be empty')
        if not self.frame_id.strip():
            raise ValueError('frame_id: must not be empty (MoveIt Servo drops such commands)')
        if self.control_period <= 0:
            raise ValueError('control_period: must be > 0')
        if self.gripper_action_name and not self.gripper_action_name.strip('/'):
            raise ValueError('gripper_action_name: not a valid action name')

    @property
    def unnorm_key_or_none(self) -> str | None:
        return self.unnorm_key or None


def _check_value(spec: ParameterSpec, value: Any) -> Any:
    """`value` (ints widened to float where the parameter is a float); ValueError naming the
    parameter when it has the wrong type or is out of range."""
    expected = type(spec.default)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if type(value) is not expected:
        raise ValueError(f'{spec.name}: expected {expected.__name__}, got '
                         f'{type(value).__name__} {value!r}')
    if spec.choices and value not in spec.choices:
        raise ValueError(f'{spec.name}: {value!r} not in {list(spec.choices)}')
    if expected in (int, float):
        if expected is float and not math.isfinite(value):
            raise ValueError(f'{spec.name}: must be finite')
        if spec.min_value is not None and value < spec.min_value:
            raise ValueError(f'{spec.name}: {value} is below the minimum {spec.min_value}')
        if spec.max_value is not None and value > spec.max_value:
            raise ValueError(f'{spec.name}: {value} is above the maximum {spec.max_value}')
    return value


def default_values() -> dict[str, Any]:
    return {spec.name: spec.default for spec in PARAMETERS}


def settings_from_parameters(values: Mapping[str, Any]) -> tuple[EngineConfig, NodeSettings]:
    """The one mapping: parameter values -> (EngineConfig, NodeSettings).

    `values` may omit parameters (their defaults apply); unknown names raise ValueError.
    Integers given for float parameters are accepted (YAML `1` for `1.0`).
    """
    unknown = sorted(set(values) - set(PARAMETERS_BY_NAME))
    if unknown:
        raise ValueError(f'unknown parameters {unknown}; known: {sorted(PARAMETERS_BY_NAME)}')
    merged = default_values()
    merged.update(values)
    engine, node = {}, {}
    for spec in PARAMETERS:
        value = _check_value(spec, merged[spec.name])
        (engine if spec.target == 'engine' else node)[spec.name] = value
    engine['draft_path'] = engine['draft_path'] or None
    return EngineConfig.from_dict(engine), NodeSettings(**node)


def default_node_settings() -> NodeSettings:
    return settings_from_parameters({})[1]


def load_time_refusal(name: str) -> str:
    """The reason given when a load-time parameter is set at runtime."""
    return (f'{name} is a load-time parameter: the model is built from it at start-up; set it '
            'in the params file or as a launch argument and restart the node')


def tunable_engine_changes(old: EngineConfig, new: EngineConfig) -> dict[str, Any]:
    """Engine tunables whose values differ, for `Engine.set_tunables(**changes)`."""
    return {name: getattr(new, name) for name in TUNABLE_ENGINE_FIELDS
            if getattr(old, name) != getattr(new, name)}


def describe_range(spec: ParameterSpec) -> str:
    """Human-readable constraints, shared by the descriptor, README table and YAML comments."""
    parts = []
    if spec.choices:
        parts.append('one of ' + ', '.join(str(c) for c in spec.choices))
    if spec.min_value is not None:
        unit = f' {spec.unit}' if spec.unit else ''
        parts.append(f'[{spec.min_value}, {spec.max_value}]{unit}')
    elif spec.unit:
        parts.append(spec.unit)
    parts.append('tunable' if spec.is_tunable else 'load-time')
    return '; '.join(parts)


def declare_parameters(node) -> dict[str, Any]:
    """Declare every parameter on an rclpy node; returns {name: value} after overrides."""
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    declared = []
    for spec in PARAMETERS:
        descriptor = ParameterDescriptor(description=spec.description,
                                         additional_constraints=describe_range(spec))
        if isinstance(spec.default, float) and spec.min_value is not None:
            descriptor.floating_point_range = [FloatingPointRange(
                from_value=float(spec.min_value), to_value=float(spec.max_value), step=0.0)]
        elif (isinstance(spec.default, int) and not isinstance(spec.default, bool)
              and spec.min_value is not None):
            descriptor.integer_range = [IntegerRange(
                from_value=int(spec.min_value), to_value=int(spec.max_value), step=1)]
        declared.append((spec.name, spec.default, descriptor))
    params = node.declare_parameters('', declared)
    return {p.name: p.value for p in params}


__all__ = ['ParameterSpec', 'PARAMETERS', 'PARAMETERS_BY_NAME', 'TUNABLE_PARAMETERS',
           'LOAD_TIME_PARAMETERS', 'ENGINE_FIELDS_NOT_EXPOSED', 'NodeSettings',
           'settings_from_parameters', 'default_values', 'default_node_settings',
           'load_time_refusal', 'tunable_engine_changes', 'describe_range',
           'declare_parameters']
