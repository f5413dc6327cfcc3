"""What every family's prompt builder shares about an instruction: the error it raises for one
it cannot turn into a prompt (``PromptError``: empty, too long, not a str; a ``ValueError``, so
the engine reports it as bad input) and the longest instruction any builder accepts, in
characters (the token limit is the engine's ``max_instruction_tokens``). Plain Python.
"""
from __future__ import annotations

MAX_INSTRUCTION_CHARS = 2000


class PromptError(ValueError):
    """An instruction that cannot be turned into a prompt (empty, too long, ...)."""


__all__ = ['PromptError', 'MAX_INSTRUCTION_CHARS']
