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

from typing import Sequence

from ..validation import check_int
from .draft_tree import DraftTree, chain_tree
from .drafter import Drafter

PREVIOUS_ACTION_DRAFT = 'previous_action'   # the draft_path value that selects this drafter


class PreviousActionDrafter(Drafter):
    def __init__(self, max_tokens: int):
        # Action positions a frame may decide (the codec's max_tokens: OpenVLA's action_dim).
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self._stream_of: dict[int, str] = {}        # request id -> its stream
        self._decided: dict[int, int] = {}          # request id -> tokens decided so far
        self._roots: dict[int, int] = {}            # request id -> its last decided token
        # stream -> per action position, (request id, token) of the newest frame deciding it
        self._newest: dict[str, list[tuple[int, int] | None]] = {}

    # ---- the drafter interface ---------------------------------------------------------------

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        self.check_update(begins, advances)
        for begin in begins:
            # The prefill decided the accepted chain (speculative prefill) and the root.
            decided = [*begin.decided_before_root, begin.root_token]
            self._stream_of[begin.request_id] = str(begin.stream_id)
            self._decided[begin.request_id] = len(decided)
            self._roots[begin.request_id] = int(begin.root_token)
            self._record(begin.stream_id, begin.request_id, 0, decided)
        for adv in advances:
            # The accepted drafts (len(path) - 1) and the bonus token are now decided, at the
            # positions after the root's.
            decided = self._decided[adv.request_id]
            self._record(self._stream_of[adv.request_id], adv.request_id, decided,
                         [*list(adv.path_tokens)[1:], adv.bonus])
            self._decided[adv.request_id] = decided + len(adv.path_tokens)
            self._roots[adv.request_id] = int(adv.bonus)

    def check_update(self, begins, advances) -> None:
        """What ``update`` refuses, checked without changing anything."""
        for begin in begins:
            if begin.request_id in self._decided:
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
            path = [int(t) for t in adv.path_tokens]
            if not path or path[0] != self._roots[adv.request_id]:
                raise ValueError(f'path_tokens: must start with the current root '
                                 f'{self._roots[adv.request_id]}, got {path[:1]}')
            if self._decided[adv.request_id] + len(path) > self.max_tokens:
                raise ValueError(f'path_tokens: {len(path)} more tokens exceed the action of '
                                 f'{self.max_tokens} for request {adv.request_id}')

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        check_int('top_k', top_k, minimum=1)
        max_nodes = check_int('max_nodes', max_nodes, minimum=2)
        if len(request_ids) != len(depths):
            raise ValueError(f'depths: one per request, got {len(depths)} for '
                             f'{len(request_ids)} requests')
        trees = []
        for request_id, depth in zip(request_ids, depths):
            depth = check_int('depth', depth, minimum=1)
            self._check_known(request_id)
            decided = self._decided[request_id]
            newest = self._newest.get(self._stream_of[request_id], ())
            chain = []
            for position in range(decided, min(decided + depth, decided + max_nodes - 1,
                                               len(newest))):
                if newest[position] is None:
                    break
                chain.append(newest[position][1])
            trees.append(chain_tree(self._roots[request_id], chain))
        return trees

    @property
    def has_prefill_draft(self) -> bool:
        return True

    def prefill_draft(self, stream_id: str, max_len: int) -> list[int]:
        """The stream's newest decided tokens from action position 0, up to ``max_len`` and up
        to the first position no frame of the stream has decided (empty for a new stream)."""
        max_len = check_int('max_len', max_len, minimum=0)
        chain = []
        for entry in self._newest.get(str(stream_id), ())[:max_len]:
            if entry is None:
                break
            chain.append(entry[1])
        return chain

    @property
    def derives_depth(self) -> bool:
        return True

    def release(self, request_id) -> None:
        self._stream_of.pop(request_id, None)
        self._decided.pop(request_id, None)
        self._roots.pop(request_id, None)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int) -> None:
        """``request_id`` orders the action among the frames of its stream (newer wins)."""
        tokens = [int(t) for t in tokens]
        if not 1 <= len(tokens) <= self.max_tokens:
            raise ValueError(f'tokens: an action has 1 to {self.max_tokens} tokens, got '
                             f'{len(tokens)}')
        self._record(stream_id, int(request_id), 0, tokens)

    def forget_stream(self, stream_id: str | None) -> None:
        if stream_id is None:
            self._newest.clear()
        else:
            self._newest.pop(str(stream_id), None)

    # ---- inspection ---------------------------------------------------------------------------

    def num_decided(self, request_id: int) -> int:
        """Tokens the request has decided so far (its chain starts at this position)."""
        self._check_known(request_id)
        return self._decided[request_id]

    def previous_action(self, stream_id: str) -> tuple[int | None, ...] | None:
        """The stream's newest decided token at each action position (None where no frame has
        decided it yet), which its next drafts continue; None for a stream with nothing."""
        newest = self._newest.get(str(stream_id))
        return None if newest is None else tuple(
            None if entry is None else entry[1] for entry in newest)

    def _record(self, stream_id, request_id, first: int, tokens) -> None:
        newest = self._newest.setdefault(str(stream_id), [None] * self.max_tokens)
        for position, token in enumerate(tokens, start=first):
            entry = newest[position]
            if entry is None or entry[0] <= request_id:
                newest[position] = (request_id, int(token))

    def _check_known(self, request_id) -> None:
        if request_id not in self._decided:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')


__all__ = ['PREVIOUS_ACTION_DRAFT', 'PreviousActionDrafter']
