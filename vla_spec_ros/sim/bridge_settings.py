"""Settings of the simulator bridge node, and the command conventions it shares with the VLA
node (pure Python: no rclpy, no torch).

`BridgeSettings` holds the bridge's parameters (the node declares one ROS parameter per field,
described in `DESCRIPTIONS`) and validates them at construction: a bad value raises ValueError
naming the field. `check_delay` (lock-step `action_delay`, `delay_hold`, `delay_frames`) and
`check_camera_delay` (real-time `camera_delay`) validate the delay settings on their own, for
the callers that take them without a `BridgeSettings` (the in-process episode loop, the
closed-loop harness, `delayed_lockstep`, `realtime_clock`).

`matched_command_parameters` gives a VLA node and a bridge the same control period and the same
command conventions (`SHARED_COMMAND_PARAMETERS`): the condition for
`twist_to_action.action_from_twist` to recover each action exactly. The launch file and the
closed-loop harness build both nodes' parameters with it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from vla_spec_ros.validation import check_int, check_number

SIM_MODES = ('lockstep', 'realtime')
DELAY_HOLDS = ('previous', 'zero')
DELAY_FRAMES = ('every', 'one_in_flight')
MAX_ACTION_DELAY = 1000
MAX_CAMERA_DELAY = 1000

# Command conventions a VLA node and a bridge must share for the bridge to recover each action
# exactly: unit scales, speed limits far above Meta-World's 1 cm steps (a clamp would change the
# action), gripper message = the model's gripper value in [0, 1] (1 = open).
SHARED_COMMAND_PARAMETERS = {
    'linear_scale': 1.0, 'angular_scale': 1.0, 'max_linear_speed': 10.0,
    'max_angular_speed': 20.0, 'gripper_open_position': 1.0, 'gripper_closed_position': 0.0,
}
# Lock-step waits for each action before the next frame exists (a republished frame keeps its
# stamp), so the observation age grows with the inference time; the VLA node's max_action_age
# (also its watchdog's limit) is set to its maximum there so waiting never turns into a stale
# hold. In real time the node's own limit applies.
MAX_ACTION_AGE_S = {'lockstep': 60.0, 'realtime': 1.0}


def matched_command_parameters(control_rate_hz: float, sim_mode: str) -> tuple[dict, dict]:
    """(VLA node overrides, bridge overrides) with the same control period and conventions."""
    if sim_mode not in SIM_MODES:
        raise ValueError(f'sim_mode: {sim_mode!r} not in {list(SIM_MODES)}')
    control_rate_hz = check_number('control_rate_hz', control_rate_hz, above=0.0)
    period = 1.0 / control_rate_hz
    shared = dict(SHARED_COMMAND_PARAMETERS, control_period=period)
    vla = dict(shared, gripper_binarize=False, gripper_invert=False, enabled=True,
               max_action_age=MAX_ACTION_AGE_S[sim_mode])
    bridge = dict(shared, control_rate_hz=float(control_rate_hz), sim_mode=sim_mode,
                  command_timeout_s=max(0.5, 3.0 * period))
    return vla, bridge


@dataclass(frozen=True)
class BridgeSettings:
    """Parameters of the simulator bridge node; validated at construction.

    control_period, the scales, the speed limits and the gripper positions must equal the VLA
    node's parameters of the same names, else actions are not recovered exactly.
    """

    task_name: str = 'button-press-topdown'
    seed: int = 0
    episodes: int = 1
    instruction: str = ''
    image_size: int = 64
    camera: str = 'corner4'
    max_steps: int = 150
    frame_id: str = 'camera'
    sim_mode: str = 'lockstep'
    control_rate_hz: float = 5.0
    control_period: float = 0.2
    linear_scale: float = 1.0
    angular_scale: float = 1.0
    max_linear_speed: float = 0.25
    max_angular_speed: float = 1.0
    gripper_open_position: float = 1.0
    gripper_closed_position: float = 0.0
    lockstep_timeout_s: float = 5.0
    max_republish: int = 3
    command_timeout_s: float = 0.5
    instruction_settle_s: float = 0.5
    episode_timeout_s: float = 600.0
    action_delay: int = 0
    delay_hold: str = 'previous'
    delay_frames: str = 'every'
    camera_delay: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(f.default, float):
                object.__setattr__(self, f.name, check_number(f.name, value))
            elif isinstance(f.default, int) and not isinstance(f.default, bool):
                object.__setattr__(self, f.name, check_int(f.name, value))
            elif type(value) is not type(f.default):
                raise ValueError(f'{f.name}: expected {type(f.default).__name__}, got '
                                 f'{value!r}')
        if self.sim_mode not in SIM_MODES:
            raise ValueError(f'sim_mode: {self.sim_mode!r} not in {list(SIM_MODES)}')
        check_delay(self.action_delay, self.delay_hold, self.delay_frames)
        if self.action_delay and self.sim_mode != 'lockstep':
            raise ValueError('action_delay: applies to sim_mode lockstep only (real time has '
                             'the delay of the real inference; see camera_delay)')
        check_camera_delay(self.camera_delay, self.sim_mode)
        for name in ('control_rate_hz', 'control_period', 'linear_scale', 'angular_scale',
                     'lockstep_timeout_s', 'command_timeout_s', 'episode_timeout_s'):
            # > 0: a zero scale cannot be inverted
            check_number(name, getattr(self, name), above=0.0)
        for name in ('max_linear_speed', 'max_angular_speed', 'instruction_settle_s'):
            check_number(name, getattr(self, name), minimum=0.0)
        for name in ('seed', 'episodes', 'max_steps', 'image_size', 'max_republish'):
            check_int(name, getattr(self, name),
                      minimum=0 if name in ('seed', 'max_republish') else 1)
        if self.gripper_open_position == self.gripper_closed_position:
            raise ValueError('gripper_open_position: must differ from gripper_closed_position')
        if not self.frame_id.strip():
            raise ValueError('frame_id: must not be empty')


# ROS parameter descriptions of the fields above (the bridge declares one parameter each).
DESCRIPTIONS = {
    'task_name': 'Meta-World task run by main()', 'seed': 'Base seed of main()\'s episodes',
    'episodes': 'Episodes run by main()', 'instruction': 'Instruction for main()\'s episodes; '
    'empty = the task phrasing chosen from the episode seed',
    'image_size': 'Camera image side in pixels (the model\'s input size, else the VLA node '
    'resizes)', 'camera': 'Meta-World camera name',
    'max_steps': 'Steps before an episode ends unsuccessfully',
    'frame_id': 'frame_id of ~/image', 'sim_mode': 'lockstep or realtime',
    'control_rate_hz': 'Real-time step rate', 'control_period': 'Seconds one action delta '
    'spans (must match the VLA node)', 'linear_scale': 'Must match the VLA node',
    'angular_scale': 'Must match the VLA node', 'max_linear_speed': 'Servo limit on the linear '
    'velocity norm (m/s)', 'max_angular_speed': 'Servo limit on the angular velocity norm',
    'gripper_open_position': 'Gripper command meaning open (must match the VLA node)',
    'gripper_closed_position': 'Gripper command meaning closed (must match the VLA node)',
    'lockstep_timeout_s': 'Republish the frame after this long without its command',
    'max_republish': 'Lock-step: republications of one frame before the episode fails',
    'command_timeout_s': 'Real time: older commands give zero motion',
    'instruction_settle_s': 'Pause after publishing a new instruction before the first frame',
    'episode_timeout_s': 'main(): give up on an episode after this long',
    'action_delay': 'Lock-step: apply the action decided from period k\'s frame at period '
    'k + action_delay (0 = plain lock-step)',
    'delay_hold': 'Delayed lock-step: while no new action lands, hold the previous action or '
    'zero motion (previous, zero; the gripper keeps its value)',
    'delay_frames': 'Delayed lock-step: frames sent to the policy: every (pipelined) or '
    'one_in_flight (a new frame only when the previous answer landed)',
    'camera_delay': 'Real time: publish the frame rendered at control period t at period '
    't + camera_delay, keeping its capture stamp (a slow camera pipeline; 0 = at once)',
}


def check_delay(action_delay, delay_hold: str = 'previous', delay_frames: str = 'every') -> int:
    """The delay settings, validated (ValueError naming the field); returns `action_delay`."""
    check_int('action_delay', action_delay, minimum=0, maximum=MAX_ACTION_DELAY,
              unit='control periods')
    if delay_hold not in DELAY_HOLDS:
        raise ValueError(f'delay_hold: {delay_hold!r} not in {list(DELAY_HOLDS)}')
    if delay_frames not in DELAY_FRAMES:
        raise ValueError(f'delay_frames: {delay_frames!r} not in {list(DELAY_FRAMES)}')
    return action_delay


def check_camera_delay(camera_delay, sim_mode: str = 'realtime') -> int:
    """`camera_delay` validated (ValueError naming the field): an int in [0,
    MAX_CAMERA_DELAY] control periods, > 0 in real time only (lock-step has action_delay)."""
    check_int('camera_delay', camera_delay, minimum=0, maximum=MAX_CAMERA_DELAY,
              unit='control periods')
    if camera_delay and sim_mode != 'realtime':
        raise ValueError('camera_delay: applies to sim_mode realtime only (lock-step waits for '
                         'every answer; its delay is action_delay)')
    return camera_delay


__all__ = ['SIM_MODES', 'DELAY_HOLDS', 'DELAY_FRAMES', 'MAX_ACTION_DELAY', 'MAX_CAMERA_DELAY',
           'SHARED_COMMAND_PARAMETERS', 'MAX_ACTION_AGE_S', 'matched_command_parameters',
           'BridgeSettings', 'DESCRIPTIONS', 'check_delay', 'check_camera_delay']
