"""What the scripted experts are doing, in words: each task's phases and the facts a
reasoning policy can be taught to write (the embedded reasoning model's training text).

Meta-World's scripted experts (metaworld.policies, v3) choose their target by a few distance
tests on the state: hand above the object or not, at its height or not. ``PHASES`` restates
those tests per task, in the expert's own order, each with the subtask's words and why it is
the current one; ``phase_index(task, state)`` returns the phase the expert is in (the branch
its ``_desired_pos`` takes for this state), ``target_offset`` is where that branch aims
relative to the object. ``test/test_expert_phases.py`` checks each phase's target against the
expert's own action on recorded states. ``OBJECTS`` names each task's object and its half
size (metres), for a box around it in the image (sim/camera_projection.py).

State layout (Meta-World v3): hand position 0:3, gripper opening 3, the object's position 4:7.
Plain numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Phase:
    """One branch of an expert: ``subtask`` (what it does), ``reason`` (why now), ``applies``
    (state, anchor) -> bool (the branch's own test; the last phase applies always), ``target``
    (state, anchor) -> the point the expert moves the hand to. ``anchor``: the expert's
    reference point (the object's position plus its fixed offset)."""

    subtask: str
    reason: str
    applies: Callable
    target: Callable


@dataclass(frozen=True)
class TaskPhases:
    obj: str                     # the object's name in the text
    half_size: tuple             # (x, y, z) metres, the object's box around its position
    anchor_offset: tuple         # the expert's offset from the object's position
    phases: tuple                # Phase, in the expert's order


def _xy(state, anchor):
    return float(np.linalg.norm(state[:2] - anchor[:2]))


def _always(state, anchor):
    return True


def _offset(dx, dy, dz):
    return lambda state, anchor: anchor + np.array([dx, dy, dz])


PHASES = {
    'button-press-topdown': TaskPhases('button', (0.02, 0.02, 0.01), (0.0, 0.0, 0.0), (
        Phase('move above the button', 'the gripper is not above the button',
              lambda s, a: _xy(s, a) > 0.04, _offset(0.0, 0.0, 0.1)),
        Phase('press the button down', 'the gripper is above the button', _always,
              _offset(0.0, 0.0, 0.0)))),
    'drawer-open': TaskPhases('drawer handle', (0.05, 0.02, 0.02), (0.0, 0.0, -0.02), (
        Phase('move above the drawer handle', 'the gripper is not above the handle',
              lambda s, a: _xy(s, a) > 0.06, _offset(0.0, 0.0, 0.3)),
        Phase('lower to the drawer handle', 'the gripper is above the handle',
              lambda s, a: abs(s[2] - a[2]) > 0.04, _offset(0.0, 0.0, 0.0)),
        Phase('pull the drawer open', 'the gripper is at the handle', _always,
              _offset(0.0, -0.06, 0.0)))),
    'drawer-close': TaskPhases('drawer handle', (0.05, 0.02, 0.02), (0.0, 0.0, -0.02), (
        Phase('rise above the drawer', 'the gripper is low behind the handle',
              lambda s, a: s[1] > a[1] and s[2] < a[2] + 0.23,
              lambda s, a: np.array([s[0], s[1], a[2] + 0.5])),
        Phase('move in front of the drawer', 'the gripper is high behind the handle',
              lambda s, a: s[1] > a[1], _offset(0.0, -0.075, 0.23)),
        Phase('lower in front of the handle', 'the gripper is in front of the handle',
              lambda s, a: abs(s[2] - a[2]) > 0.04, _offset(0.0, -0.075, 0.0)),
        Phase('push the drawer shut', 'the gripper is at the handle height', _always,
              _offset(0.0, 0.0, 0.0)))),
    'window-open': TaskPhases('window handle', (0.02, 0.02, 0.04), (-0.03, -0.03, -0.08), (
        Phase('move above the window handle', 'the gripper is not above the handle',
              lambda s, a: _xy(s, a) > 0.04, _offset(0.0, 0.0, 0.3)),
        Phase('lower to the window handle', 'the gripper is above the handle',
              lambda s, a: abs(s[2] - a[2]) > 0.02, _offset(0.0, 0.0, 0.0)),
        Phase('slide the window open', 'the gripper is at the handle', _always,
              _offset(0.1, 0.0, 0.0)))),
    'window-close': TaskPhases('window handle', (0.02, 0.02, 0.04), (0.03, -0.03, -0.08), (
        Phase('move above the window handle', 'the gripper is not above the handle',
              lambda s, a: _xy(s, a) > 0.04, _offset(0.0, 0.0, 0.25)),
        Phase('lower to the window handle', 'the gripper is above the handle',
              lambda s, a: abs(s[2] - a[2]) > 0.02, _offset(0.0, 0.0, 0.0)),
        Phase('slide the window closed', 'the gripper is at the handle', _always,
              _offset(-0.1, 0.0, 0.0)))),
    'handle-press': TaskPhases('handle', (0.02, 0.05, 0.02), (0.0, -0.02, 0.0), (
        Phase('move above the handle', 'the gripper is not above the handle',
              lambda s, a: _xy(s, a) > 0.02, _offset(0.0, 0.0, 0.2)),
        Phase('press the handle down', 'the gripper is above the handle', _always,
              _offset(0.0, 0.0, -0.5)))),
}


def task_phases(task: str) -> TaskPhases:
    if task not in PHASES:
        raise ValueError(f'task: no phases for {task!r}; known: {sorted(PHASES)}')
    return PHASES[task]


def anchor(task: str, state) -> np.ndarray:
    """The expert's reference point: the object's position plus the task's offset."""
    return np.asarray(state[4:7], dtype=np.float64) + np.array(task_phases(task).anchor_offset)


def phase_index(task: str, state) -> int:
    """The phase (index into the task's ``phases``) the expert is in at ``state``."""
    state = np.asarray(state, dtype=np.float64)
    point = anchor(task, state)
    for index, phase in enumerate(task_phases(task).phases):
        if phase.applies(state, point):
            return index
    raise AssertionError('the last phase applies always')


def phase_target(task: str, state) -> np.ndarray:
    """Where the expert moves the hand at ``state`` (its current phase's target)."""
    state = np.asarray(state, dtype=np.float64)
    phase = task_phases(task).phases[phase_index(task, state)]
    return phase.target(state, anchor(task, state))


def object_corners(task: str, state) -> np.ndarray:
    """The 8 corners (8, 3) of the task object's box at ``state``."""
    centre = np.asarray(state[4:7], dtype=np.float64)
    half = np.array(task_phases(task).half_size)
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)])
    return centre + signs * half


__all__ = ['PHASES', 'Phase', 'TaskPhases', 'anchor', 'object_corners', 'phase_index',
           'phase_target', 'task_phases']
