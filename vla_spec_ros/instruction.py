"""What every family's prompt builder shares about an instruction: the error it raises for one
it cannot turn into a prompt (``PromptError``: empty, too long, not a str; a ``ValueError``, so
the engine reports it as bad input) and the longest instruction any builder accepts, in
characters (the token limit is the engine's ``max_instruction_tokens``). Plain Python.
"""
from __future__ import annotations

MAX_INSTRUCTION_CHARS = 2000


class PromptError(ValueError):
    """An instruction that cannot be turned into a prompt (empty, too long, ...)."""


def checked_instruction(instruction) -> str:
    """The instruction stripped, or PromptError when it is not a str, empty or too long."""
    if not isinstance(instruction, str):
        raise PromptError(f'instruction must be a str, got {type(instruction).__name__}')
    text = instruction.strip()
    if not text:
        raise PromptError('instruction is empty')
    if len(text) > MAX_INSTRUCTION_CHARS:
        raise PromptError(f'instruction has {len(text)} characters; the limit is '
                          f'{MAX_INSTRUCTION_CHARS}')
    return text


__all__ = ['PromptError', 'MAX_INSTRUCTION_CHARS', 'checked_instruction']
