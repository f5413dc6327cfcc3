"""The action-codec protocol: how a model family's generated tokens become actions.

The engine never asks what an action is; it asks its codec (plain Python, no torch):

- how many tokens a frame may decode (``max_tokens``: the KV ring, the draft lanes and the
  speculative-prefill chain are sized by it) and when a frame's tokens are complete (all
  ``max_tokens`` of them for a fixed-length codec; for a variable-length codec, the
  ``end_token`` marker, kept as the frame's last token, or ``max_tokens`` at the latest);
- which token ids are action tokens (``is_action_token``: greedy decoding may be restricted
  to them, ``action_token_range``) and how far apart two of them are (``token_to_bin``:
  relaxed acceptance compares bins, never raw ids; a codec whose tokens have no meaningful
  distance sets ``supports_relaxed_acceptance`` False, and an engine must refuse
  ``relax_threshold`` > 0 with it before any frame);
- what the tokens mean (``decode``: normalised values of shape ``action_shape``, one step
  ``(D,)`` or a chunk ``(K, D)``, NaN and an invalid flag where a token is not an action);
  un-normalisation with the dataset's statistics stays with ``actions.ActionStats``.

OpenVLA's 256 uniform bins per dimension (``actions.ActionTokenizer``) are one codec: a
fixed length of ``action_dim`` tokens. A FAST-style codec (pi0-FAST: a variable number of
compressed tokens ended by a marker) fits the same protocol through ``end_token``.
"""
from __future__ import annotations

from typing import Sequence


class ActionCodec:
    """Tokens <-> actions for one model family (see the module docstring)."""

    max_tokens: int                         # most tokens one frame decodes
    end_token: int | None = None            # a frame ends at this token (variable length)
    action_shape: tuple[int, ...] = ()      # what one frame decodes to: (D,) or (K, D)
    supports_relaxed_acceptance: bool = True    # token_to_bin is defined (relax r > 0)
    # Most draft tokens a lookup drafter (draft_path previous_output) proposes per verifier
    # forward; None: up to max_tokens. A codec of long outputs sets it from measured cost.
    max_draft_chain: int | None = None
    # Most draft tokens verified right after a verification that accepted none of its draft
    # (None: no cap). A codec whose later tokens follow from the earlier ones (BPE over a whole
    # chunk: one changed token changes or shifts what follows, so a positional chain that
    # missed keeps missing) sets it from measured cost; one whose positions are independent (a
    # bin per dimension: a miss in one says nothing of the next) leaves it None.
    draft_after_miss: int | None = None
    # The tokens that open the action in an output of text then action (a reasoning policy):
    # relaxed acceptance compares bins only after them. Empty: the whole output is the action.
    action_marker: tuple[int, ...] = ()
    writes_reasoning: bool = False          # text before the action (``describe`` reads it)
    # Whether a token's position in the frame is its meaning (a bin per dimension: the draft's
    # token at a position is the guess for that position). False for a codec whose tokens
    # spell pieces of varying length (BPE over a chunk): ``continue_draft`` then realigns a
    # draft after a decided token that spelled a different piece than the draft's.
    positional_drafts: bool = True

    @property
    def step_tokens(self) -> int:
        """Tokens per control step: a chunk of K steps decodes K * step_tokens (temporal
        drafting shifts a previous chunk by whole steps). Default: one step per frame."""
        return self.max_tokens

    def is_action_token(self, token: int) -> bool:
        raise NotImplementedError

    def token_to_bin(self, token: int) -> int:
        """The bin of an action token: relaxed acceptance accepts a draft within r bins."""
        raise NotImplementedError

    def decode(self, tokens: Sequence[int]):
        """A frame's tokens -> ``actions.DecodedActions`` (normalised, ``action_shape``)."""
        raise NotImplementedError

    def describe(self, tokens: Sequence[int]):
        """What a frame's tokens say besides the action (a reasoning policy's text, parsed:
        ``ActionResult.reasoning``); None for a codec whose output is the action alone."""
        return None

    def with_reasoning_budget(self, max_reasoning_tokens: int) -> 'ActionCodec':
        """This codec with another budget of text before the action (``EngineConfig.
        max_reasoning_tokens``); a codec of the action alone refuses it."""
        raise ValueError(f'max_reasoning_tokens: {max_reasoning_tokens} given, but this model '
                         f'writes no reasoning before its action ({type(self).__name__})')

    def action_token_range(self) -> tuple[int, int] | None:
        """(first, last) ids of the action tokens, a contiguous range, for greedy decoding
        restricted to them; None when the codec's action tokens are not one range."""
        return None

    def continue_draft(self, decided: Sequence[int], draft: Sequence[int]) -> tuple[int, ...]:
        """How ``draft`` (a whole drafted frame) continues a frame that has decided the tokens
        ``decided``: the draft tokens for the positions after them. By position here
        (``draft[len(decided):]``); a codec with ``positional_drafts`` False continues from
        the place in the draft that matches what ``decided`` spells. Any answer is only a
        draft: the verifier decides every token."""
        return tuple(int(t) for t in draft[len(decided):])

    def is_complete(self, tokens: Sequence[int]) -> bool:
        """Whether a frame that decided ``tokens`` is done."""
        return len(tokens) >= self.max_tokens or (
            self.end_token is not None and bool(tokens) and int(tokens[-1]) == self.end_token)

    def cut(self, decided: Sequence[int], new_tokens: Sequence[int]) -> tuple[int, ...]:
        """Of the tokens a step decided after ``decided``, those the frame keeps: up to its
        end marker (included) and to ``max_tokens`` in all."""
        kept = []
        for token in new_tokens[:max(0, self.max_tokens - len(decided))]:
            kept.append(int(token))
            if self.end_token is not None and int(token) == self.end_token:
                break
        return tuple(kept)


__all__ = ['ActionCodec']
