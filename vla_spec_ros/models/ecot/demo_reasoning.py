"""The embedded reasoning model's training text: an ECoT reasoning written from what the
scripted expert knows at one transition (the facts a dataset gives: ``DemoSet.expert_facts``,
sim/expert_facts.py).

ECoT's fields, each from one fact:

- TASK: the instruction;
- PLAN: the expert's phases for the task, in order;
- VISIBLE OBJECTS: the task object's box in the image's pixels;
- SUBTASK REASONING / SUBTASK: why the current phase, and the phase;
- MOVE REASONING: where the phase's target lies from the hand, in direction words;
- MOVE: the expert's delta this step in direction words;
- GRIPPER POSITION: the hand's pixel (u, v) in the image.

Direction words are in the robot's base frame: x right / left, y forward / backward, z up /
down; a component counts when it is at least ``MOVE_WORD_FRACTION`` of the largest step (the
delta) or ``TARGET_WORD_M`` metres (the target). The text runs about 50-70 tokens of the
model's tokenizer and is what follows the prompt's ``TASK:``; the policy then writes
`` ACTION:``, "▁" and the action's bins (prompt.py).
"""
from __future__ import annotations

import numpy as np

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


def reasoning_text(instruction: str, facts) -> str:
    """The text after ``TASK:`` for one transition's facts (module docstring)."""
    x1, y1, x2, y2 = facts.box
    u, v = facts.gripper
    toward = direction_words(facts.toward, TARGET_WORD_M)
    move = direction_words(facts.move, MOVE_WORD_FRACTION * MAX_STEP_M)
    return (f'{instruction.strip().lower()}. {TAGS[1]} {", ".join(facts.plan)}. '
            f'{TAGS[2]} {facts.obj} [{x1}, {y1}, {x2}, {y2}] '
            f'{TAGS[3]} {facts.reason}. {TAGS[4]} {facts.subtask}. '
            f'{TAGS[5]} the target is {toward}. {TAGS[6]} {move}. '
            f'{TAGS[7]} [{u}, {v}]')


__all__ = ['MOVE_WORD_FRACTION', 'direction_words', 'reasoning_text']
