"""Drafting a chunk codec's frame from the stream's previous chunk, shifted to the new frame's
control step and re-encoded through the codec (no draft model, no forward).

A codec whose tokens do not belong to control steps (FAST: every DCT coefficient spans the
whole chunk, codecs/fast.py) gives the previous frame's tokens no reason to repeat once the
robot has moved on: the chunk the policy decided at control step s_r planned steps s_r ..
s_r + H - 1, and a frame taken at step s > s_r is expected to plan s .. s + H - 1, i.e. the old
plan from its row k = s - s_r on, with k rows past its end to fill. ``ShiftedChunkDrafter``
drafts exactly that frame: the stream's newest decoded chunk (``codec.decode`` of an observed
action, in the codec's normalised units), shifted by k rows (``shift_chunk``), its last k rows
extrapolated, then ``codec.encode`` (the whole frame: the codec's prefix text tokens, its action
tokens, its suffix and end marker). The chain for a request that has decided some tokens is
``codec.continue_draft(decided, draft)``: by position for most codecs (the draft's tokens d,
d + 1, ...), by coefficient for FAST (after a decided token that spelled another stretch of
coefficients than the draft's, the draft's later coefficients are spelled again from there).
The verifier checks it like any draft: with ``relax_threshold`` 0 the tokens are greedy
decoding's, whatever is proposed.

Extrapolation past the old plan's end (``EXTRAPOLATIONS``):
- ``hold``: the last planned step repeated. What the demonstrations' chunks do past an
  episode's end, and never overshoots a bound (a gripper command stays -1 or +1);
- ``linear``: the last step continued by its last difference (clipped to [-1, 1]): right for a
  motion that keeps its velocity, wrong at a stop or a gripper flip.
``docs/speculation.md`` (Drafting FAST tokens) has the measured comparison.

The control steps come from ``Frame.control_step`` (``DraftBegin.step``, ``observe_action``'s
``step``); a frame or chunk without one is drafted unshifted (k = 0: the previous chunk
re-encoded). Plain Python and numpy (no torch); selected with ``draft_path: shifted_chunk``
(hold) or ``shifted_chunk_linear``.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Sequence

import numpy as np

from ...action_codec import ActionCodec
from ...validation import check_int
from .draft_tree import DraftTree, chain_tree
from .drafter import Drafter, check_path_from_root, check_proposal

SHIFTED_CHUNK_DRAFT = 'shifted_chunk'               # draft_path values selecting this drafter
SHIFTED_CHUNK_LINEAR_DRAFT = 'shifted_chunk_linear'
EXTRAPOLATIONS = ('hold', 'linear')
CHUNKS_KEPT = 4                     # decoded chunks kept per stream (the newest by request id)


def shift_chunk(chunk: np.ndarray, num_steps: int, extrapolation: str = 'hold') -> np.ndarray:
    """(H, D) chunk planned at step s_r -> (H, D) the plan from step s_r + num_steps on: rows
    num_steps .. H - 1, then ``num_steps`` extrapolated rows (module docstring)."""
    chunk = np.asarray(chunk, dtype=np.float64)
    if chunk.ndim != 2 or chunk.shape[0] < 1:
        raise ValueError(f'chunk: expected (H, D) with H >= 1, got shape {chunk.shape}')
    check_int('num_steps', num_steps, minimum=0)
    if extrapolation not in EXTRAPOLATIONS:
        raise ValueError(f'extrapolation: expected one of {EXTRAPOLATIONS}, got '
                         f'{extrapolation!r}')
    horizon = chunk.shape[0]
    kept = chunk[min(num_steps, horizon):]
    num_new = horizon - len(kept)
    last = chunk[-1]
    if extrapolation == 'hold' or horizon < 2:
        tail = np.repeat(last[None], num_new, axis=0)
    else:
        # New row t is old row num_steps + t: that many steps past the old last row.
        offsets = num_steps + np.arange(horizon - num_new, horizon) - (horizon - 1)
        tail = np.clip(last[None] + offsets[:, None] * (last - chunk[-2])[None], -1.0, 1.0)
    return np.concatenate([kept, tail], axis=0)


@dataclass
class _Chunk:
    request_id: int
    step: int | None
    normalized: np.ndarray          # (H, D) in the codec's normalised units


class ShiftedChunkDrafter(Drafter):
    """See the module docstring. ``codec``: the runner's action codec (``decode``, ``encode``,
    ``action_shape`` of two dimensions; ``continue_draft`` if it has one, else drafts go by
    position); ``max_tokens``: tokens one frame decides at most."""

    def __init__(self, codec, max_tokens: int, extrapolation: str = 'hold'):
        if len(tuple(codec.action_shape)) != 2:
            raise ValueError(f'codec: shifted-chunk drafting needs a chunk codec (action_shape '
                             f'(H, D)), got {tuple(codec.action_shape)}')
        if extrapolation not in EXTRAPOLATIONS:
            raise ValueError(f'extrapolation: expected one of {EXTRAPOLATIONS}, got '
                             f'{extrapolation!r}')
        self.codec = codec
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self.extrapolation = extrapolation
        self._chunks: dict[str, list[_Chunk]] = {}       # stream -> newest first
        self._draft_of: dict[int, tuple[int, ...]] = {}  # request id -> its drafted frame
        self._decided: dict[int, list[int]] = {}         # request id -> tokens decided (the
        #                                                  last one is the root of its tree)
        # How a draft continues decided tokens: the codec's rule, else the protocol's (by
        # position) for a codec that has none.
        self._continue_draft = getattr(codec, 'continue_draft', None) or partial(
            ActionCodec.continue_draft, codec)

    # ---- the drafter interface ---------------------------------------------------------------

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        self.check_update(begins, advances)
        for begin in begins:
            self._draft_of[begin.request_id] = self.draft_frame(str(begin.stream_id),
                                                                begin.step)
            self._decided[begin.request_id] = [int(t) for t in (*begin.decided_before_root,
                                                                begin.root_token)]
        for adv in advances:
            self._decided[adv.request_id] += [*(int(t) for t in list(adv.path_tokens)[1:]),
                                              int(adv.bonus)]

    def check_update(self, begins, advances) -> None:
        for begin in begins:
            if begin.request_id in self._decided:
                raise ValueError(f'request_id: {begin.request_id} already has a draft state; '
                                 'release it first')
            if not isinstance(begin.stream_id, str) or not begin.stream_id:
                raise ValueError(f'stream_id: shifted-chunk drafting needs the stream of '
                                 f'request {begin.request_id}, got {begin.stream_id!r}')
        for adv in advances:
            self._check_known(adv.request_id)
            check_path_from_root(adv, self._decided[adv.request_id][-1])

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        depths, max_nodes = check_proposal(request_ids, depths, top_k, max_nodes)
        trees = []
        for request_id, depth in zip(request_ids, depths):
            self._check_known(request_id)
            decided = self._decided[request_id]
            length = min(depth, max_nodes - 1, self.max_tokens - len(decided))
            chain = self._continue_draft(decided, self._draft_of[request_id])
            trees.append(chain_tree(decided[-1], chain[:max(0, length)]))
        return trees

    @property
    def needs_features(self) -> bool:
        return False

    @property
    def has_prefill_draft(self) -> bool:
        return True

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        max_len = check_int('max_len', max_len, minimum=0)
        return list(self.draft_frame(str(stream_id), step)[:min(max_len, self.max_tokens)])

    @property
    def derives_depth(self) -> bool:
        return True

    def release(self, request_id) -> None:
        for table in (self._draft_of, self._decided):
            table.pop(request_id, None)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        """Keeps the decoded chunk (a frame the codec refuses is not drafted from)."""
        decoded = self.codec.decode([int(t) for t in tokens])
        if not decoded.is_valid:
            return
        chunks = self._chunks.setdefault(str(stream_id), [])
        chunks.append(_Chunk(int(request_id), None if step is None else int(step),
                             np.asarray(decoded.normalized, dtype=np.float64)))
        chunks.sort(key=lambda c: -c.request_id)
        del chunks[CHUNKS_KEPT:]

    def forget_stream(self, stream_id: str | None) -> None:
        if stream_id is None:
            self._chunks.clear()
        else:
            self._chunks.pop(str(stream_id), None)

    # ---- the rule -----------------------------------------------------------------------------

    def draft_frame(self, stream_id: str, step: int | None) -> tuple[int, ...]:
        """The drafted frame of a new frame of ``stream_id`` at control ``step``: the newest
        chunk planned at or before ``step`` (else the newest), shifted by the steps between
        them and re-encoded; () when the stream has no chunk or the codec cannot encode it."""
        chunks = self._chunks.get(stream_id)
        if not chunks:
            return ()
        source = chunks[0]
        if step is not None:
            source = next((c for c in chunks if c.step is not None and c.step <= step),
                          source)
        shift = 0 if step is None or source.step is None else max(0, int(step) - source.step)
        try:
            frame = self.codec.encode(shift_chunk(source.normalized, shift, self.extrapolation))
        except ValueError:          # a chunk the codec's vocabulary cannot spell: no draft
            return ()
        return tuple(int(t) for t in frame[:self.max_tokens])

    def _check_known(self, request_id) -> None:
        if request_id not in self._decided:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')


__all__ = ['EXTRAPOLATIONS', 'SHIFTED_CHUNK_DRAFT', 'SHIFTED_CHUNK_LINEAR_DRAFT',
           'ShiftedChunkDrafter', 'shift_chunk']
