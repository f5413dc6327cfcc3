"""Test and benchmark doubles, never used by the engine.

``OracleDrafter`` is a ``Drafter`` that proposes the AR reference tokens (optionally corrupted
at a controlled rate) instead of running a draft head: the tests of the verifier side use it
for exact acceptance patterns, and ``bench/gpu.py`` for oracle acceptance calibration.

``continue_drafts_by_position`` makes a codec's drafts continue by token position (the
protocol's rule) instead of its own ``continue_draft``: the comparison row of
``bench/paced_drafts.py`` and its test.
"""
from __future__ import annotations

import random
from functools import partial
from typing import Callable, Sequence

from .action_codec import ActionCodec
from .engine.drafting.draft_tree import DraftTree, chain_tree
from .engine.drafting.drafter import Drafter
from .validation import check_int


class OracleDrafter(Drafter):
    """Proposes the AR reference tokens after the current root, as a chain.

    ``tokens_for(request_id)`` gives the request's AR reference tokens. Each proposed position
    is replaced by a wrong token with probability ``error_rate``; the coin for (request,
    position) is a fixed function of ``seed``, so the acceptance pattern does not depend on the
    order in which requests are drafted. A wrong token is drawn from ``wrong_tokens`` (minus the
    right one) when given, else it is the neighbouring id (an adjacent action bin).
    """

    def __init__(self, tokens_for: Callable[[int], Sequence[int]], action_dim: int,
                 error_rate: float = 0.0, seed: int = 0,
                 wrong_tokens: Sequence[int] | None = None):
        if not 0.0 <= float(error_rate) <= 1.0:
            raise ValueError(f'error_rate: must lie in [0, 1], got {error_rate}')
        self.tokens_for = tokens_for
        self.action_dim = check_int('action_dim', action_dim, minimum=1)
        self.error_rate = float(error_rate)
        self.seed = int(seed)
        self.wrong_tokens = None if wrong_tokens is None else [int(t) for t in wrong_tokens]
        if self.wrong_tokens is not None and len(set(self.wrong_tokens)) < 2:
            raise ValueError('wrong_tokens: needs at least two distinct tokens')
        self._num_decided: dict[int, int] = {}
        self._roots: dict[int, int] = {}
        self.num_forward_passes = 0

    def update(self, begins, advances, features) -> None:
        for begin in begins:
            self._num_decided[begin.request_id] = 1     # the prefill decided the first token
            self._roots[begin.request_id] = int(begin.root_token)
        for adv in advances:
            if adv.request_id not in self._num_decided:
                raise ValueError(f'request_id: {adv.request_id} has no draft state (begin() '
                                 'first)')
            # Accepted drafts (len(path) - 1) plus the bonus token were decided.
            self._num_decided[adv.request_id] += len(adv.path_tokens)
            self._roots[adv.request_id] = int(adv.bonus)

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        # The oracle is certain of every draft (log-probability 0): no pruning removes one.
        return [self._propose_one(r, d, max_nodes) for r, d in zip(request_ids, depths)]

    def num_decided(self, request_id: int) -> int:
        return self._num_decided[request_id]

    def _propose_one(self, request_id, depth, max_nodes) -> DraftTree:
        depth = check_int('depth', depth, minimum=1)
        max_nodes = check_int('max_nodes', max_nodes, minimum=2)
        if request_id not in self._num_decided:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')
        reference = [int(t) for t in self.tokens_for(request_id)][:self.action_dim]
        start = self._num_decided[request_id]
        count = max(0, min(depth, max_nodes - 1, len(reference) - start))
        tokens = [self._maybe_wrong(request_id, start + i, reference[start + i])
                  for i in range(count)]
        return chain_tree(self._roots[request_id], tokens)

    def release(self, request_id) -> None:
        self._num_decided.pop(request_id, None)
        self._roots.pop(request_id, None)

    def _maybe_wrong(self, request_id: int, position: int, token: int) -> int:
        if self.error_rate == 0.0:
            return token
        rng = random.Random(f'{self.seed}:{request_id}:{position}')
        if rng.random() >= self.error_rate:
            return token
        if self.wrong_tokens is not None:
            return rng.choice([t for t in self.wrong_tokens if t != token])
        return token - 1 if token > 0 else token + 1


def continue_drafts_by_position(codec) -> None:
    """Make ``codec`` (this instance only) continue drafts by token position, the protocol's
    rule, instead of its own ``continue_draft``. Drafters read the rule when they are built:
    build the engine after this call, on a codec loaded for the comparison."""
    codec.positional_drafts = True
    codec.continue_draft = partial(ActionCodec.continue_draft, codec)


__all__ = ['OracleDrafter', 'continue_drafts_by_position']
