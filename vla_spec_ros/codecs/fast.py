"""The FAST action codec (action_codec.ActionCodec) for any family that emits FAST tokens.

A frame's generated tokens are, in the model's vocabulary of ``vocab_size`` ids::

    prefix_tokens  FAST ids ...  suffix_tokens  end_token

pi0-FAST (PaliGemma, 257152 ids) generates the text "Action: " (``prefix_tokens``, when the
family leaves them to the model), the FAST ids, "|" and EOS. FAST id t is the model id
``vocab_size - 1 - skip_tokens - t`` (257023 - t with 128 skipped ids; the mapping is its
own inverse). openpi ends a frame at EOS (``suffix_tokens`` = the "|" id, ``end_token`` = EOS);
LeRobot at "|" (``suffix_tokens`` = (), ``end_token`` = the "|" id). The family passes these
facts to the constructor; nothing here knows PaliGemma.

What the protocol's terms mean here:

- ``max_tokens``: the most tokens a frame generates, prefix and end marker included (openpi's
  and LeRobot's ``max_decoding_steps``, 256). A frame ends at ``end_token`` (kept as its last
  token) or is cut at ``max_tokens``; a cut frame has no end marker and is refused.
- ``is_action_token``: a model id whose FAST id is in the loaded BPE vocabulary;
  ``action_token_range`` is those ids, one contiguous range. The prefix, suffix and end tokens
  lie outside it (checked at construction), so greedy decoding restricted to the range could
  never write them: a restriction for this codec must also allow ``text_tokens``.
- ``decode``: the whole frame -> a normalised (H, D) chunk (``action_shape``). Refused (NaN,
  ``is_valid`` False, a reason) when the frame is empty, lacks its end marker, its prefix or
  suffix differ, a non-action token sits among the FAST ids, or the FAST ids do not decode to
  exactly H x D coefficients: never padded or guessed. Tokens are read as ids, not through
  the text tokenizer: openpi decodes to text, splits at "Action: " and "|", strips and
  re-encodes; where that round trip is not the identity on the ids, openpi may read another
  action (its model family has to say whether that ever happens). Un-normalisation stays with
  ``actions.ActionStats`` (quantiles q01/q99 to [-1, 1], the same formula; openpi adds 1e-6
  to q99 - q01).
- ``step_tokens``: FAST tokens do not belong to control steps (every DCT coefficient spans the
  whole chunk), so a frame is one unit (``max_tokens``, the protocol's default): temporal
  drafting by token position drafts the previous token sequence as a whole. A previous chunk
  shifted by whole control steps must be decoded, shifted and re-encoded (``encode``).

Relaxed acceptance (``token_to_bin``), the one distance that means something for BPE tokens:
acceptance compares a draft token with the verifier's at the same node, after the same
accepted tokens, so both continue the same coefficient sequence at the same index. When both
tokens spell exactly one coefficient (their bytes are one whole character), their bins are
those integer coefficients and |bin(a) - bin(b)| is the difference of that one DCT coefficient
in quantisation steps: accepting it at distance r changes one dimension's decoded trajectory
by r / scale in L2 norm (orthonormal IDCT), at most r / scale * sqrt(2 / H) at any step. (Two
ids may spell the same coefficient, e.g. the published alphabet's raw characters below 33
beside their byte-level spellings: distance 0, the same action.)
Every other BPE token merges several coefficients (or part of one) whose distance to another
token has no single value (they may even differ in how many coefficients they spell, which
would change the frame's length): it gets a bin of its own, ``ISOLATED_BIN_STRIDE`` away from
every other bin, so it is accepted only when it is the verifier's token exactly, at any
threshold the engine allows. ``relaxed_acceptance=False`` refuses relaxation outright:
``supports_relaxed_acceptance`` is False and ``token_to_bin`` raises ValueError; an engine
should refuse ``relax_threshold`` > 0 for a codec whose ``supports_relaxed_acceptance`` is
False when it is configured, before any frame.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..action_codec import ActionCodec
from ..actions import DecodedActions
from ..validation import check_int
from .fast_tokenizer import REPLACEMENT_CHAR, FastDecodeError, FastTokenizer

# Bins of tokens that spell more (or less) than one coefficient: token id t gets
# ISOLATED_BIN_BASE + t * ISOLATED_BIN_STRIDE, farther from every other bin than any
# relax_threshold (the engine allows at most 255 bins; a coefficient's bin is below 2**21).
ISOLATED_BIN_BASE = 1 << 32
ISOLATED_BIN_STRIDE = 1 << 20

DEFAULT_MAX_TOKENS = 256            # openpi's and LeRobot's max_decoding_steps
# Draft tokens verified after a verification that accepted none (ActionCodec.draft_after_miss):
# no bound. While drafts were continued by token position, a chain that missed once accepted
# nothing in 89 % of the next verifications, and a bound of 2 cut a frame's p99. Continued by
# coefficient (continue_draft) they keep being accepted: on metaworld-demo-fast's validation
# frames (seed 2000, spec, 1 thread, 3 rounds) no bound took 3.06 forwards per frame against
# 3.26 with a bound of 2, p99 34.0 against 36.5 ms (bench/draft_after_miss.py;
# docs/speculation.md, "After a miss").
DRAFT_AFTER_MISS = None
DEFAULT_SKIP_TOKENS = 128           # pi0-FAST leaves the last 128 ids (PaliGemma's <seg>) out


class FastActionCodec(ActionCodec):
    """FAST tokens in a model's vocabulary <-> a normalised (H, D) chunk (module docstring)."""

    def __init__(self, tokenizer: FastTokenizer, *, vocab_size: int, end_token: int,
                 skip_tokens: int = DEFAULT_SKIP_TOKENS, prefix_tokens: Sequence[int] = (),
                 suffix_tokens: Sequence[int] = (), max_tokens: int = DEFAULT_MAX_TOKENS,
                 relaxed_acceptance: bool = True):
        self.tokenizer = tokenizer
        self.vocab_size = check_int('vocab_size', vocab_size, minimum=1)
        self.skip_tokens = check_int('skip_tokens', skip_tokens, minimum=0)
        self.end_token = check_int('end_token', end_token, minimum=0)
        self.prefix_tokens = tuple(check_int('prefix_tokens', t, minimum=0) for t in prefix_tokens)
        self.suffix_tokens = tuple(check_int('suffix_tokens', t, minimum=0) for t in suffix_tokens)
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self.supports_relaxed_acceptance = bool(relaxed_acceptance)
        self.draft_after_miss = DRAFT_AFTER_MISS
        self.positional_drafts = False      # continue_draft realigns by coefficient
        params = tokenizer.params
        self.action_shape = (params.action_horizon, params.action_dim)
        # FAST id t <-> model id last_action_id - t; FAST ids 0 .. num_ids - 1.
        self.last_action_id = self.vocab_size - 1 - self.skip_tokens
        self.first_action_id = self.last_action_id - (tokenizer.num_ids - 1)
        if self.first_action_id < 0:
            raise ValueError(f'vocab_size: {vocab_size} - skip_tokens {skip_tokens} leaves no '
                             f'room for {tokenizer.num_ids} FAST ids')
        for name, ids in (('prefix_tokens', self.prefix_tokens),
                          ('suffix_tokens', self.suffix_tokens), ('end_token', (end_token,))):
            wrong = [t for t in ids if self.is_action_token(t) or t >= self.vocab_size]
            if wrong:
                raise ValueError(f'{name}: {wrong} inside the FAST range '
                                 f'[{self.first_action_id}, {self.last_action_id}] or past '
                                 f'vocab_size {self.vocab_size}')
        if self.end_token in self.prefix_tokens + self.suffix_tokens:
            raise ValueError(f'end_token: {self.end_token} also in prefix_tokens/suffix_tokens '
                             '(the frame would end there)')
        frame_overhead = len(self.prefix_tokens) + len(self.suffix_tokens) + 1
        if self.max_tokens <= frame_overhead:
            raise ValueError(f'max_tokens: {self.max_tokens} leaves no FAST token after '
                             f'{frame_overhead} prefix/suffix/end tokens')
        self._bins = self._coefficient_bins()

    @classmethod
    def from_folder(cls, folder, *, action_horizon: int | None = None,
                    action_dim: int | None = None, **kwargs) -> 'FastActionCodec':
        """tokenizer.json + fast_config.json (or processor_config.json) from ``folder``; the
        keyword arguments are the constructor's (``vocab_size``, ``end_token``, ...)."""
        tokenizer = FastTokenizer.load(Path(folder), action_horizon=action_horizon,
                                       action_dim=action_dim)
        return cls(tokenizer, **kwargs)

    # ---- the protocol -------------------------------------------------------------------

    @property
    def text_tokens(self) -> tuple[int, ...]:
        """The frame's non-action ids: prefix, suffix and end marker (in that order)."""
        return (*self.prefix_tokens, *self.suffix_tokens, self.end_token)

    def is_action_token(self, token: int) -> bool:
        return self.first_action_id <= int(token) <= self.last_action_id

    def action_token_range(self) -> tuple[int, int]:
        return self.first_action_id, self.last_action_id

    def to_fast_id(self, token: int) -> int:
        """Model id -> FAST id (ValueError outside the action range)."""
        if not self.is_action_token(token):
            raise ValueError(f'token {token} is not a FAST token '
                             f'[{self.first_action_id}, {self.last_action_id}]')
        return self.last_action_id - int(token)

    def to_model_id(self, fast_id: int) -> int:
        """FAST id -> model id (``vocab_size - 1 - skip_tokens - fast_id``)."""
        if not 0 <= int(fast_id) < self.tokenizer.num_ids:
            raise ValueError(f'FAST id {fast_id} outside [0, {self.tokenizer.num_ids})')
        return self.last_action_id - int(fast_id)

    def token_to_bin(self, token: int) -> int:
        """A single-coefficient token's integer coefficient; an isolated bin for every other
        FAST token (see the module docstring)."""
        if not self.supports_relaxed_acceptance:
            raise ValueError('relaxed acceptance is off for this FAST codec '
                             '(relaxed_acceptance=False): use relax_threshold 0')
        return self._bins[self.to_fast_id(token)]

    def encode(self, normalized: np.ndarray) -> tuple[int, ...]:
        """A normalised (H, D) chunk -> the whole frame's model ids (prefix, FAST ids,
        suffix, end marker): what the model would generate for it, e.g. a draft. ValueError
        when the chunk does not fit the tokenizer or the frame exceeds ``max_tokens``."""
        fast_ids = self.tokenizer.encode(normalized)
        frame = (*self.prefix_tokens, *(self.last_action_id - t for t in fast_ids),
                 *self.suffix_tokens, self.end_token)
        if len(frame) > self.max_tokens:
            raise ValueError(f'the chunk needs {len(frame)} tokens, max_tokens is '
                             f'{self.max_tokens}')
        return frame

    def decode(self, tokens: Sequence[int]) -> DecodedActions:
        """A frame's tokens -> the normalised (H, D) chunk, or NaN and the reason it is
        refused."""
        try:
            fast_ids = self._fast_ids(tuple(int(t) for t in tokens))
            chunk = self.tokenizer.decode(fast_ids)
        except FastDecodeError as exc:
            return DecodedActions(np.full(self.action_shape, np.nan), False, str(exc))
        return DecodedActions(chunk, True, None)

    def continue_draft(self, decided: Sequence[int], draft: Sequence[int]) -> tuple[int, ...]:
        """The draft's coefficients after the ones ``decided`` spells, spelled again by the
        BPE, then the suffix and end marker: aligned by coefficient, not by token position.

        Why: a BPE token spells one coefficient, several, or part of one. When the verifier
        decides a token that spells a different stretch than the draft's token there (one
        coefficient where the draft merged two), every later draft token stands one piece
        off, and by position the draft is not accepted again in that frame (measured: after
        such a miss a positional chain accepted nothing in 89 % of verifications). Re-spelling
        the draft's own later coefficients from the decided one on keeps its guess for them.

        By position (the protocol's default) where this has no meaning: ``decided`` still in
        the prefix or already past the FAST ids, or ending inside a character; a draft that
        is not a frame of this codec's layout."""
        decided = tuple(int(t) for t in decided)
        draft = tuple(int(t) for t in draft)
        by_position = draft[len(decided):]
        num_prefix = len(self.prefix_tokens)
        body = decided[num_prefix:]
        if len(decided) <= num_prefix or decided[:num_prefix] != self.prefix_tokens \
                or draft[:num_prefix] != self.prefix_tokens \
                or not all(self.is_action_token(t) for t in body):
            return by_position
        draft_body = []
        for token in draft[num_prefix:]:
            if not self.is_action_token(token):
                break
            draft_body.append(self.last_action_id - token)
        bpe = self.tokenizer.bpe
        spelled = bpe.decode([self.last_action_id - t for t in body])
        drafted = bpe.decode(draft_body)
        if REPLACEMENT_CHAR in spelled or REPLACEMENT_CHAR in drafted:
            return by_position
        rest = drafted[len(spelled):]
        ids = bpe.encode(rest).ids if rest else []
        return (*(self.last_action_id - i for i in ids), *self.suffix_tokens, self.end_token)

    # ---- helpers --------------------------------------------------------------------------

    def _fast_ids(self, tokens: tuple[int, ...]) -> list[int]:
        """The frame's FAST ids, after checking its layout (FastDecodeError otherwise)."""
        if not tokens:
            raise FastDecodeError('no tokens')
        if tokens[-1] != self.end_token:
            raise FastDecodeError(f'no end marker {self.end_token} (the frame has '
                                  f'{len(tokens)} tokens, max_tokens {self.max_tokens})')
        num_prefix, num_suffix = len(self.prefix_tokens), len(self.suffix_tokens)
        if tokens[:num_prefix] != self.prefix_tokens:
            raise FastDecodeError(f'the frame starts {list(tokens[:num_prefix])}, expected '
                                  f'the prefix {list(self.prefix_tokens)}')
        body_end = len(tokens) - 1 - num_suffix
        if body_end < num_prefix or tokens[body_end:-1] != self.suffix_tokens:
            raise FastDecodeError(f'the frame ends {list(tokens[max(body_end, 0):])}, expected '
                                  f'{[*self.suffix_tokens, self.end_token]}')
        body = tokens[num_prefix:body_end]
        if not body:
            raise FastDecodeError('no FAST tokens between the prefix and the end')
        wrong = [(num_prefix + i, t) for i, t in enumerate(body) if not self.is_action_token(t)]
        if wrong:
            raise FastDecodeError(f'non-action token(s) (position, id) {wrong[:8]} among the '
                                  'FAST tokens')
        return [self.last_action_id - t for t in body]

    def _coefficient_bins(self) -> list[int]:
        """Per FAST id: its coefficient when it spells exactly one, else an isolated bin."""
        texts = self.tokenizer.bpe.decode_batch([[i] for i in range(self.tokenizer.num_ids)])
        min_token = self.tokenizer.params.min_token
        return [ord(text) + min_token if len(text) == 1 and text != '\ufffd'
                else ISOLATED_BIN_BASE + i * ISOLATED_BIN_STRIDE
                for i, text in enumerate(texts)]


__all__ = ['FastActionCodec', 'ISOLATED_BIN_BASE', 'ISOLATED_BIN_STRIDE']
