"""The embedded reasoning model's training text: an ECoT reasoning written from the scripted
expert's own state, for one transition of a scripted demonstration.

ECoT's fields, each from a fact the expert or the simulator knows (sim/expert_phases.py for the
phases, sim/camera_projection.py for pixels):

- TASK: the instruction;
- PLAN: the expert's phases for the task, in order;
- VISIBLE OBJECTS: the task object's box in the image's pixels (its 3-D box projected);
- SUBTASK REASONING / SUBTASK: why the current phase, and the phase;
- MOVE REASONING: where the phase's target lies from the hand, in direction words;
- MOVE: the expert's delta this step in direction words;
- GRIPPER POSITION: the hand's pixel (u, v) in the image.

Direction words are in the robot's base frame: x right / left, y forward / backward, z up /
down; a component counts when it is at least ``MOVE_WORD_FRACTION`` of the largest step (the
delta) or ``TARGET_WORD_M`` metres (the target). Pixels are integers in the model's image
(``image_size`` wide), clipped to it. The text runs about 50-90 tokens of the model's tokenizer
and is what follows the prompt's ``TASK:``; the policy then writes `` ACTION:``, "▁" and the
action's bins (prompt.py).
"""
from __future__ import annotations

import numpy as np

from ...sim.camera_projection import project
from ...sim.expert_phases import (object_corners, phase_index, phase_target,
                                  task_phases)
from .reasoning_text import TAGS

MOVE_WORD_FRACTION = 0.25
MAX_STEP_M = 0.01            # the largest position delta of one step (Meta-World's 1 cm)
TARGET_WORD_M = 0.01
_WORDS = (('right', 'left'), ('forward', 'backward'), ('up', 'down'))


def direction_words(vector, threshold: float) -> str:
    """'right forward down', ...; 'stay' when no component reaches ``threshold``."""
    words = [pair[0] if value > 0 else pair[1]
             for pair, value in zip(_WORDS, np.asarray(vector, dtype=np.float64)[:3])
             if abs(value) >= threshold]
    return ' '.join(words) if words else 'stay'


def _pixel(value: float, image_size: int) -> int:
    return int(np.clip(np.floor(value), 0, image_size - 1))


def object_box(task: str, state, camera_matrix, image_size: int) -> tuple[int, int, int, int]:
    """The task object's box (x1, y1, x2, y2) in pixels: its 3-D box's corners projected."""
    corners = project(camera_matrix, object_corners(task, state))
    low, high = corners.min(axis=0), corners.max(axis=0)
    return (_pixel(low[0], image_size), _pixel(low[1], image_size),
            _pixel(high[0], image_size), _pixel(high[1], image_size))


def reasoning_text(task: str, instruction: str, state, action, camera_matrix,
                   image_size: int) -> str:
    """The text after ``TASK:`` for one transition (module docstring)."""
    state = np.asarray(state, dtype=np.float64)
    spec = task_phases(task)
    phase = spec.phases[phase_index(task, state)]
    x1, y1, x2, y2 = object_box(task, state, camera_matrix, image_size)
    u, v = project(camera_matrix, state[:3])
    toward = direction_words(phase_target(task, state) - state[:3], TARGET_WORD_M)
    move = direction_words(np.asarray(action)[:3], MOVE_WORD_FRACTION * MAX_STEP_M)
    plan = ', '.join(p.subtask for p in spec.phases)
    return (f'{instruction.strip().lower()}. {TAGS[1]} {plan}. '
            f'{TAGS[2]} {spec.obj} [{x1}, {y1}, {x2}, {y2}] '
            f'{TAGS[3]} {phase.reason}. {TAGS[4]} {phase.subtask}. '
            f'{TAGS[5]} the target is {toward}. {TAGS[6]} {move}. '
            f'{TAGS[7]} [{_pixel(u, image_size)}, {_pixel(v, image_size)}]')


__all__ = ['MOVE_WORD_FRACTION', 'direction_words', 'object_box', 'reasoning_text']
