"""ECoT's reasoning text: its fields, in the order the policy writes them, and their parse.

An ECoT policy answers ``TASK: ... PLAN: ... VISIBLE OBJECTS: ... SUBTASK REASONING: ...
SUBTASK: ... MOVE REASONING: ... MOVE: ... GRIPPER POSITION: ... ACTION: <7 bins>``: one
space between a tag and its value and between fields, no newlines; an empty field is still
written (``VISIBLE OBJECTS:  SUBTASK ...``). The prompt ends with ``TASK:``, so the generated
text starts with the task's value. Visible objects are ``name [x1, y1, x2, y2]`` joined by
``, ``; the gripper position is a list of pixel coordinates (one point, or the current point
and the ones after it: ``[x0, y0, x1, y1, ...]``), in the camera image's pixels (256 x 256 for
Bridge). Plain Python.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# Tags in the order ECoT writes them; ACTION closes the text (codecs/reasoning.py's marker).
TAGS = ('TASK:', 'PLAN:', 'VISIBLE OBJECTS:', 'SUBTASK REASONING:', 'SUBTASK:',
        'MOVE REASONING:', 'MOVE:', 'GRIPPER POSITION:')
ACTION_TAG = 'ACTION:'
FIELD_NAMES = {tag: tag[:-1].lower().replace(' ', '_') for tag in TAGS}

# A box alone: the name is the text since the previous box. (A lazy `(.*?)` name in front of
# the box made a long field without a box quadratic: 6 s for 16 kB, inside the engine's step.)
_BOX = re.compile(r'\[(-?\d+),\s*(-?\d+),\s*(-?\d+),\s*(-?\d+)\]')
_INT = re.compile(r'-?\d+')


@dataclass(frozen=True)
class Reasoning:
    """What the policy wrote before its action: ``text`` as generated (the prompt's ``TASK:``
    put back in front), ``fields`` by name (task, plan, visible_objects, subtask_reasoning,
    subtask, move_reasoning, move, gripper_position: the values as text, for the fields
    present), ``objects`` ((name, (x1, y1, x2, y2)) pairs), ``gripper`` ((x, y) points),
    ``num_tokens`` (tokens generated before the action marker)."""

    text: str
    fields: dict = field(default_factory=dict)
    objects: tuple = ()
    gripper: tuple = ()
    num_tokens: int = 0


def split_fields(text: str) -> dict:
    """``TAG: value`` pairs of ``text`` by field name; the tags that do not occur are absent.
    A tag is found where it stands at the start or after a space (``SUBTASK:`` inside
    ``SUBTASK REASONING:`` is not a match: longer tags are found first)."""
    spans = []
    for tag in sorted(TAGS, key=len, reverse=True):
        for match in re.finditer(r'(?:^|(?<=\s))' + re.escape(tag), text):
            start, end = match.span()
            if not any(s <= start < e for s, e, _ in spans):
                spans.append((start, end, tag))
    spans.sort()
    fields = {}
    for i, (_, end, tag) in enumerate(spans):
        stop = spans[i + 1][0] if i + 1 < len(spans) else len(text)
        fields.setdefault(FIELD_NAMES[tag], text[end:stop].strip())
    return fields


def parse_objects(value: str) -> tuple:
    """``name [x1, y1, x2, y2], ...`` -> ((name, (x1, y1, x2, y2)), ...); linear in the
    text's length."""
    objects, start = [], 0
    for match in _BOX.finditer(value):
        name = value[start:match.start()].rstrip().strip(' ,')
        objects.append((name, tuple(int(match.group(i)) for i in range(1, 5))))
        start = match.end()
    return tuple(objects)


def parse_points(value: str) -> tuple:
    """``[x0, y0, x1, y1, ...]`` -> ((x0, y0), (x1, y1), ...); an odd trailing value dropped."""
    numbers = [int(v) for v in _INT.findall(value)]
    return tuple(zip(numbers[0::2], numbers[1::2]))


def parse_reasoning(generated: str, num_tokens: int = 0) -> Reasoning:
    """The generated text before the action (the prompt ended with ``TASK:``) -> Reasoning."""
    text = f'{TAGS[0]} {generated.strip()}'
    fields = split_fields(text)
    return Reasoning(text, fields, parse_objects(fields.get('visible_objects', '')),
                     parse_points(fields.get('gripper_position', '')), num_tokens)


__all__ = ['ACTION_TAG', 'FIELD_NAMES', 'Reasoning', 'TAGS', 'parse_objects', 'parse_points',
           'parse_reasoning', 'split_fields']
