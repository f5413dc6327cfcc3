"""What the scripted expert knows at one transition, for a reasoning policy's training text:
the task's plan (its phases), the current phase and why, where the phase's target lies from
the hand, the expert's delta, and pixel positions in the camera image (the hand's point, the
task object's box). A model family turns the facts into its own text
(models/ecot/demo_reasoning.py writes ECoT's); ``DemoSet.expert_facts`` gives one per
transition of a collected dataset.

Phases from sim/expert_phases.py, pixels from sim/camera_projection.py: integers in the
``image_size`` image, clipped to it. Plain numpy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .camera_projection import project
from .expert_phases import object_corners, phase_index, phase_target, task_phases


@dataclass(frozen=True)
class ExpertFacts:
    plan: tuple                 # the task's phases, in order (their subtask words)
    obj: str                    # the task object's name
    box: tuple                  # its box (x1, y1, x2, y2) in pixels
    reason: str                 # why the current phase
    subtask: str                # the current phase
    toward: np.ndarray          # (3,) metres from the hand to the phase's target
    move: np.ndarray            # (3,) the expert's position delta this step, metres
    gripper: tuple              # the hand's pixel (u, v)


def _pixel(value: float, image_size: int) -> int:
    return int(np.clip(np.floor(value), 0, image_size - 1))


def object_box(task: str, state, camera_matrix, image_size: int) -> tuple[int, int, int, int]:
    """The task object's box (x1, y1, x2, y2) in pixels: its 3-D box's corners projected."""
    corners = project(camera_matrix, object_corners(task, state))
    low, high = corners.min(axis=0), corners.max(axis=0)
    return (_pixel(low[0], image_size), _pixel(low[1], image_size),
            _pixel(high[0], image_size), _pixel(high[1], image_size))


def expert_facts(task: str, state, action, camera_matrix, image_size: int) -> ExpertFacts:
    """The facts of one transition: the state the expert read and the action it chose."""
    state = np.asarray(state, dtype=np.float64)
    spec = task_phases(task)
    phase = spec.phases[phase_index(task, state)]
    u, v = project(camera_matrix, state[:3])
    return ExpertFacts(tuple(p.subtask for p in spec.phases), spec.obj,
                       object_box(task, state, camera_matrix, image_size), phase.reason,
                       phase.subtask, phase_target(task, state) - state[:3],
                       np.asarray(action, dtype=np.float64)[:3],
                       (_pixel(u, image_size), _pixel(v, image_size)))


__all__ = ['ExpertFacts', 'expert_facts', 'object_box']
