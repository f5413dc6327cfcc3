"""Temporal drafting: each stream's previous action is the draft (no draft model, no forward).

A robot's camera frames follow one another at the control rate, and the actions a policy
decides for consecutive frames are mostly the same bins: on the embedded Meta-World model,
85 % of the action tokens of consecutive frames along an expert's path are identical
(docs/speculation.md, Temporal drafting). ``PreviousActionDrafter`` proposes, for a request
that has decided ``d`` of its tokens, the chain ``previous[d], previous[d+1], ...`` where
``previous[i]`` is the stream's newest decided token at action position ``i``: the previous
frame's action, or, while frames of the stream are in flight together
(pipelining), the part of a newer frame's action already decided (a frame admitted one step
earlier is one step ahead). The verifier checks the chain like any draft tree: with
``relax_threshold`` 0 the tokens are exactly greedy decoding's, whatever it proposes; what the
chain buys is the tokens it gets right, at no drafting cost (no draft forward, no device
work, a few microseconds of host work per request).

For a codec whose drafts are not positional (``ActionCodec.positional_drafts`` False: FAST's
BPE tokens spell stretches of varying length), the drafter is given the codec's
``continue_draft``: a frame that is one unit (``step_tokens == max_tokens``) is then drafted
from its stream's newest whole action, continued past the request's decided tokens by that
rule (by coefficient for FAST), instead of token by token by position.

Selected with ``draft_path: previous_action``. Plain Python (no torch).

Contract with the speculative strategy (engine/packed.py): ``update`` as for every drafter
(``DraftBegin.stream_id`` names the request's stream, required here); ``observe_action`` with
every action as soon as it is decided (the tokens of a request's last verification reach the
drafter only there, before the action may wait for an earlier frame of its stream);
``forget_stream`` when a stream is reset (a new episode: its last action says nothing about
the next). Newer frames win: a position keeps the token of the highest request id that decided
it. The chain stops at the first position no request of the stream has decided yet; a stream
with nothing decided gets the root alone (a plain decode step). The chain is certain by
construction (log-probability 0 per node), so ``tree_min_prob`` never prunes it;
``tree_top_k`` is unused; ``tree_depth`` does not bound it (``derives_depth``: the engine asks
for every remaining token, the chain stops where the stream's knowledge stops), only
``tree_max_nodes`` does.

Speculative prefill: ``prefill_draft`` gives a new frame's chain from position 0 before its
prefill, so the forward that prefills the frame verifies it too; a frame whose action repeats
is decided in that one forward. ``DraftBegin.decided_before_root`` then carries the chain
tokens the prefill accepted.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from ...validation import check_int
from .draft_tree import DraftTree, chain_tree
from .drafter import Drafter, check_path_from_root, check_proposal

PREVIOUS_ACTION_DRAFT = 'previous_action'   # the draft_path value that selects this drafter


# Frames of a stream kept to draft from (the newest, by request id): enough for a chunk's
# worth of shifted steps and the frames in flight together.
MIN_FRAMES_KEPT = 8


@dataclass
class _FrameTokens:
    """What one frame of a stream decided so far, and the control step its image was taken
    at (None when unknown: such a frame is drafted from, and drafts, by position only)."""

    request_id: int
    step: int | None
    tokens: list = field(default_factory=list)
    whole: bool = False         # the whole action (observe_action), not a frame in flight


class PreviousActionDrafter(Drafter):
    """Each stream's previous action (or chunk) as the draft; see the module docstring.

    ``max_tokens``: tokens one frame decides (the codec's); ``step_tokens``: tokens per
    control step (a chunk of K steps has max_tokens = K * step_tokens; default one step per
    frame); ``continue_draft``: the codec's, for a codec whose drafts are not positional
    (frames of one unit only; see the module docstring).
    """

    def __init__(self, max_tokens: int, step_tokens: int | None = None,
                 continue_draft: Callable[[Sequence[int], Sequence[int]], Sequence[int]]
                 | None = None):
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self.step_tokens = self.max_tokens if step_tokens is None else check_int(
            'step_tokens', step_tokens, minimum=1, maximum=self.max_tokens)
        if self.max_tokens % self.step_tokens:
            raise ValueError(f'step_tokens: {self.step_tokens} does not divide max_tokens '
                             f'{self.max_tokens} (a chunk is whole control steps)')
        self.num_steps = self.max_tokens // self.step_tokens
        if continue_draft is not None and self.num_steps != 1:
            raise ValueError(f'continue_draft: only for a frame of one unit, but step_tokens '
                             f'{self.step_tokens} makes {self.num_steps} control steps')
        self._continue_draft = continue_draft
        self.max_frames_kept = max(MIN_FRAMES_KEPT, 2 * self.num_steps)
        self._frame_of: dict[int, _FrameTokens] = {}    # request id -> its frame (in flight)
        self._stream_of: dict[int, str] = {}            # request id -> its stream
        self._roots: dict[int, int] = {}                # request id -> its last decided token
        self._frames: dict[str, dict[int, _FrameTokens]] = {}  # stream -> request id -> frame

    # ---- the drafter interface ---------------------------------------------------------------

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        self.check_update(begins, advances)
        for begin in begins:
            # The prefill decided the accepted chain (speculative prefill) and the root.
            frame = self._frame(str(begin.stream_id), begin.request_id, begin.step)
            frame.tokens = [int(t) for t in (*begin.decided_before_root, begin.root_token)]
            self._frame_of[begin.request_id] = frame
            self._stream_of[begin.request_id] = str(begin.stream_id)
            self._roots[begin.request_id] = int(begin.root_token)
        for adv in advances:
            # The accepted drafts (len(path) - 1) and the bonus token are now decided, at the
            # positions after the root's.
            frame = self._frame_of[adv.request_id]
            frame.tokens += [*[int(t) for t in list(adv.path_tokens)[1:]], int(adv.bonus)]
            self._roots[adv.request_id] = int(adv.bonus)

    def check_update(self, begins, advances) -> None:
        """What ``update`` refuses, checked without changing anything."""
        for begin in begins:
            if begin.request_id in self._frame_of:
                raise ValueError(f'request_id: {begin.request_id} already has a draft state; '
                                 'release it first')
            if not isinstance(begin.stream_id, str) or not begin.stream_id:
                raise ValueError(f'stream_id: temporal drafting needs the stream of request '
                                 f'{begin.request_id}, got {begin.stream_id!r}')
            if len(begin.decided_before_root) + 1 > self.max_tokens:
                raise ValueError(f'decided_before_root: {len(begin.decided_before_root)} tokens '
                                 f'and the root exceed the action of {self.max_tokens}')
        for adv in advances:
            self._check_known(adv.request_id)
            path = check_path_from_root(adv, self._roots[adv.request_id])
            if len(self._frame_of[adv.request_id].tokens) + len(path) > self.max_tokens:
                raise ValueError(f'path_tokens: {len(path)} more tokens exceed the action of '
                                 f'{self.max_tokens} for request {adv.request_id}')

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        depths, max_nodes = check_proposal(request_ids, depths, top_k, max_nodes)
        trees = []
        for request_id, depth in zip(request_ids, depths):
            self._check_known(request_id)
            frame = self._frame_of[request_id]
            decided = len(frame.tokens)
            end = min(decided + depth, decided + max_nodes - 1, self.max_tokens)
            if self._continue_draft is None:
                chain = self._chain(self._stream_of[request_id], frame.step, decided, end)
            else:
                chain = self._continued(self._stream_of[request_id], frame, end - decided)
            trees.append(chain_tree(self._roots[request_id], chain))
        return trees

    @property
    def needs_features(self) -> bool:
        return False                # the chain comes from decided tokens alone

    @property
    def has_prefill_draft(self) -> bool:
        return True

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        """A new frame's chain from action position 0 (``step``: its control step), up to
        ``max_len`` and to the first position nothing is known for (empty for a new
        stream)."""
        max_len = check_int('max_len', max_len, minimum=0)
        return self._chain(str(stream_id), step, 0, min(max_len, self.max_tokens))

    @property
    def derives_depth(self) -> bool:
        return True

    def release(self, request_id) -> None:
        """The request's own state goes; its tokens stay with its stream to draft from."""
        self._frame_of.pop(request_id, None)
        self._stream_of.pop(request_id, None)
        self._roots.pop(request_id, None)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        """A decided action (or chunk): ``request_id`` orders it among the frames of its
        stream (newer wins), ``step`` is the control step of its image when known."""
        tokens = [int(t) for t in tokens]
        if not 1 <= len(tokens) <= self.max_tokens:
            raise ValueError(f'tokens: an action has 1 to {self.max_tokens} tokens, got '
                             f'{len(tokens)}')
        frame = self._frame(str(stream_id), int(request_id), step)
        frame.tokens = tokens
        frame.whole = True

    def forget_stream(self, stream_id: str | None) -> None:
        if stream_id is None:
            self._frames.clear()
        else:
            self._frames.pop(str(stream_id), None)

    # ---- inspection ---------------------------------------------------------------------------

    def num_decided(self, request_id: int) -> int:
        """Tokens the request has decided so far (its chain starts at this position)."""
        self._check_known(request_id)
        return len(self._frame_of[request_id].tokens)

    def previous_action(self, stream_id: str) -> tuple[int | None, ...] | None:
        """The stream's newest decided token at each action position (None where no frame has
        decided it yet); None for a stream with nothing."""
        frames = self._newest_first(str(stream_id))
        if not frames:
            return None
        return tuple(next((f.tokens[p] for f in frames if len(f.tokens) > p), None)
                     for p in range(self.max_tokens))

    # ---- the rule -----------------------------------------------------------------------------

    def _chain(self, stream_id: str, step: int | None, first: int, end: int) -> list[int]:
        """Draft tokens for positions first .. end-1 of a frame at control ``step``, up to the
        first position with nothing to draft.

        Position p is step j = p // step_tokens, dimension d = p % step_tokens of the frame's
        chunk, i.e. control step ``step + j``. Its draft is, newest frame first, the token a
        frame of known step s_r decided for that very control step (its position
        ``(step + j - s_r) * step_tokens + d``: the previous chunk shifted by the steps between
        the two images); failing that, the newest frame's latest decided step for dimension
        d (the last known step repeated: with one step per frame, the previous action)."""
        frames = self._newest_first(stream_id)
        chain = []
        for position in range(first, end):
            j, d = divmod(position, self.step_tokens)
            token = None
            if step is not None:
                for frame in frames:
                    if frame.step is None:
                        continue
                    i = step + j - frame.step
                    p = i * self.step_tokens + d
                    if 0 <= i < self.num_steps and p < len(frame.tokens):
                        token = frame.tokens[p]
                        break
            if token is None:
                for frame in frames:
                    n = len(frame.tokens)
                    if n > d:
                        token = frame.tokens[(n - 1 - d) // self.step_tokens * self.step_tokens
                                             + d]
                        break
            if token is None:
                break
            chain.append(token)
        return chain

    def _continued(self, stream_id: str, frame: _FrameTokens, length: int) -> list[int]:
        """At most ``length`` draft tokens after ``frame``'s decided ones: the stream's newest
        whole action, continued past them by the codec's rule (none before a first action)."""
        source = next((f for f in self._newest_first(stream_id) if f.whole and f is not frame),
                      None)
        if source is None or length <= 0:
            return []
        return [int(t) for t in self._continue_draft(frame.tokens, source.tokens)[:length]]

    def _frame(self, stream_id: str, request_id: int, step) -> _FrameTokens:
        """The stream's record of ``request_id`` (made if new; the oldest beyond
        ``max_frames_kept`` are dropped)."""
        frames = self._frames.setdefault(stream_id, {})
        frame = frames.get(request_id)
        if frame is None:
            frame = frames[request_id] = _FrameTokens(request_id,
                                                      None if step is None else int(step))
            if len(frames) > self.max_frames_kept:
                del frames[min(frames)]
        elif step is not None:
            frame.step = int(step)
        return frame

    def _newest_first(self, stream_id: str) -> list[_FrameTokens]:
        frames = self._frames.get(stream_id, {})
        return [frames[r] for r in sorted(frames, reverse=True)]

    def _check_known(self, request_id) -> None:
        if request_id not in self._frame_of:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')


__all__ = ['PREVIOUS_ACTION_DRAFT', 'PreviousActionDrafter']
