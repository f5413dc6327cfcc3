"""A codec for reasoning policies: free text, a marker, then another codec's action.

An embodied chain-of-thought policy (ECoT) writes a few hundred tokens of reasoning (task,
plan, subtask, move, gripper position, ...) and then ``ACTION:`` and its action tokens, and
ends. ``ReasoningThenAction`` wraps the action codec (OpenVLA's 256 bins for ECoT) and tells
the engine, through the ``action_codec.ActionCodec`` protocol:

- a frame is complete once the action's ``inner.max_tokens`` tokens follow the first
  ``marker`` (and the ``separator`` tokens the tokenizer puts after it, when present), when
  the model ends its text without one (a ``stop_tokens`` token), or when
  ``max_reasoning_tokens`` of text, the marker, the separator and the action are spent (the
  budget: then, without an action, the frame is refused with that reason);
- the action is the ``inner.max_tokens`` tokens after the marker (and separator), decoded by
  the inner codec; everything before the marker is the reasoning (``split``);
- relaxed acceptance compares bins only after the marker (``action_marker``, read by
  ``engine/drafting/acceptance.py``): reasoning tokens are accepted only when exact;
- greedy decoding cannot be restricted to action tokens (``action_token_range`` None: the
  text needs the whole vocabulary);
- ``max_draft_chain``: draft tokens a lookup drafter proposes per verifier forward;
- ``describe``: the reasoning's tokens read by the family (``describe_text``: detokenised and
  parsed into its fields), for ``ActionResult.reasoning``.

Plain Python and numpy, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..action_codec import ActionCodec
from ..actions import DecodedActions
from ..validation import check_int

DEFAULT_MAX_REASONING_TOKENS = 1024      # ECoT's own generate(max_new_tokens=1024)
DEFAULT_MAX_DRAFT_CHAIN = 32


@dataclass(frozen=True)
class OutputParts:
    """A frame's tokens split at the marker: ``reasoning`` (before it), ``action`` (the action
    tokens after the marker and separator; () when there is no marker)."""

    reasoning: tuple
    action: tuple
    has_marker: bool


class ReasoningThenAction(ActionCodec):
    """See the module docstring. ``inner``: the action's codec (fixed length); ``marker``: the
    token ids that open the action; ``separator``: ids that may stand between the marker and
    the first action token (each optional, in order); ``stop_tokens``: ids that end the text
    (EOS)."""

    def __init__(self, inner: ActionCodec, marker: Sequence[int], *,
                 separator: Sequence[int] = (), stop_tokens: Sequence[int] = (),
                 max_reasoning_tokens: int = DEFAULT_MAX_REASONING_TOKENS,
                 max_draft_chain: int | None = DEFAULT_MAX_DRAFT_CHAIN,
                 describe_text: Callable[[tuple], Any] | None = None):
        if inner.end_token is not None:
            raise ValueError('inner: the action after a reasoning must have a fixed length')
        self.inner = inner
        self.marker = tuple(int(t) for t in marker)
        if not self.marker:
            raise ValueError('marker: the tokens that open the action are required')
        self.separator = tuple(int(t) for t in separator)
        self.stop_tokens = frozenset(int(t) for t in stop_tokens)
        self.max_reasoning_tokens = check_int('max_reasoning_tokens', max_reasoning_tokens,
                                              minimum=1)
        self.max_tokens = (self.max_reasoning_tokens + len(self.marker) + len(self.separator)
                           + inner.max_tokens)
        self.action_shape = inner.action_shape
        self.action_marker = self.marker
        self.writes_reasoning = True
        self.max_draft_chain = None if max_draft_chain is None else check_int(
            'max_draft_chain', max_draft_chain, minimum=1)
        self.supports_relaxed_acceptance = inner.supports_relaxed_acceptance
        self._describe_text = describe_text
        self._settings = dict(separator=separator, stop_tokens=stop_tokens,
                              max_draft_chain=max_draft_chain, describe_text=describe_text)

    def with_reasoning_budget(self, max_reasoning_tokens: int) -> 'ReasoningThenAction':
        return ReasoningThenAction(self.inner, self.marker,
                                   max_reasoning_tokens=max_reasoning_tokens, **self._settings)

    def describe(self, tokens: Sequence[int]):
        """The reasoning before the marker as the family reads it (``describe_text`` of its
        tokens: ECoT's parsed fields), or None when the family gave no reader."""
        if self._describe_text is None:
            return None
        return self._describe_text(self.split(tokens).reasoning)

    @property
    def step_tokens(self) -> int:
        return self.max_tokens          # one control step per frame, whatever its length

    def is_action_token(self, token: int) -> bool:
        return self.inner.is_action_token(token)

    def token_to_bin(self, token: int) -> int:
        return self.inner.token_to_bin(token)

    def action_token_range(self):
        return None

    # ---- where the action stands ----------------------------------------------------------------

    def split(self, tokens: Sequence[int]) -> OutputParts:
        """The reasoning before the first marker, and the action tokens after it (at most
        ``inner.max_tokens``; fewer while the frame is still deciding)."""
        tokens = [int(t) for t in tokens]
        start = _find(tokens, self.marker)
        if start is None:
            return OutputParts(tuple(tokens), (), False)
        position = self._action_start(tokens, start)
        action = () if position is None else tokens[position:position + self.inner.max_tokens]
        return OutputParts(tuple(tokens[:start]), tuple(action), True)

    def reasoning_prefix(self, tokens: Sequence[int]) -> tuple[int, ...] | None:
        """The output's tokens before its action (the reasoning, the marker and the separator
        tokens present), when the output holds a complete action; else None (what a reused
        reasoning starts from: engine/reasoning_reuse.py)."""
        tokens = [int(t) for t in tokens]
        start = _find(tokens, self.marker)
        position = None if start is None else self._action_start(tokens, start)
        if position is None or len(tokens) - position < self.inner.max_tokens:
            return None
        return tuple(tokens[:position])

    def is_complete(self, tokens: Sequence[int]) -> bool:
        tokens = [int(t) for t in tokens]
        return self._is_complete_at(tokens, _find(tokens, self.marker))

    def cut(self, decided: Sequence[int], new_tokens: Sequence[int]) -> tuple[int, ...]:
        """The new tokens up to the one that completes the frame (included). Finds the marker
        in ``decided`` once and then follows the new tokens one by one (a long reasoning
        would otherwise be scanned again for every token); ``cut_reference`` is the plain
        definition it must equal."""
        so_far = [int(t) for t in decided]
        start = _find(so_far, self.marker)
        kept = []
        for token in new_tokens:
            if len(so_far) >= self.max_tokens:
                break
            kept.append(int(token))
            so_far.append(int(token))
            if start is None and tuple(so_far[-len(self.marker):]) == self.marker:
                start = len(so_far) - len(self.marker)
            if self._is_complete_at(so_far, start):
                break
        return tuple(kept)

    def cut_reference(self, decided: Sequence[int], new_tokens: Sequence[int]
                      ) -> tuple[int, ...]:
        """``cut`` by its definition: ``is_complete`` of the whole output after each token."""
        so_far, kept = [int(t) for t in decided], []
        for token in new_tokens:
            if len(so_far) >= self.max_tokens:
                break
            kept.append(int(token))
            so_far.append(int(token))
            if self.is_complete(so_far):
                break
        return tuple(kept)

    def _is_complete_at(self, tokens: list, start: int | None) -> bool:
        """``is_complete`` given the first marker's position ``start`` (None: no marker)."""
        if len(tokens) >= self.max_tokens:
            return True
        if start is None:
            return bool(tokens) and tokens[-1] in self.stop_tokens
        position = self._action_start(tokens, start)
        return position is not None and len(tokens) - position >= self.inner.max_tokens

    def _action_start(self, tokens: list, start: int) -> int | None:
        """Where the action begins after the marker at ``start``: past the ``separator``
        tokens present (each optional, in order); None while the output ends before the
        separators are settled."""
        position = start + len(self.marker)
        for token in self.separator:
            if position >= len(tokens):
                return None
            if tokens[position] == token:
                position += 1
        return position

    def decode(self, tokens: Sequence[int]) -> DecodedActions:
        parts = self.split(tokens)
        if parts.has_marker and len(parts.action) == self.inner.max_tokens:
            return self.inner.decode(parts.action)
        if parts.has_marker:
            why = 'the action after the marker is incomplete'
        elif tokens and int(tokens[-1]) in self.stop_tokens:
            why = 'the text ended without an action'
        else:
            why = f'no action within max_reasoning_tokens {self.max_reasoning_tokens}'
        return DecodedActions(np.full(self.action_shape, np.nan), False, why)


def _find(tokens: list, pattern: tuple) -> int | None:
    m = len(pattern)
    for i in range(len(tokens) - m + 1):
        if tuple(tokens[i:i + m]) == pattern:
            return i
    return None


__all__ = ['DEFAULT_MAX_DRAFT_CHAIN', 'DEFAULT_MAX_REASONING_TOKENS', 'OutputParts',
           'ReasoningThenAction']
