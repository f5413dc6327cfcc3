"""EAGLE-2 dynamic trees grown as arrays (numpy): what the engine's drafter runs.

``draft_tree.grow_dynamic_tree`` is the plain reference (pure Python, one candidate at a time,
the test oracle); ``TreeGrowth`` computes the same trees a level at a time with a few numpy
operations, bit for bit: the same candidate ids (creation order: level by level, frontier
order, then the draft's rank), the same cumulative scores (float64 sums of the float32
log-probabilities, parent first, in the same order), the same ranking key ``(-score, id)``
(a stable sort of ``-score`` over candidates listed in id order) for the next frontier and
for the final rerank. ``test_drafter.py`` compares the two on random, tied and infinite
log-probabilities.

Why: a tree of the default shape (depth 4, top-k 8) has 201 candidates; the per-candidate
Python of the reference cost about as much as a draft forward on the embedded model (CPU).
"""
from __future__ import annotations

import numpy as np

from .draft_tree import NO_PARENT, ROOT, DraftTree, score_floor


class TreeGrowth:
    """One request's EAGLE-2 tree while it grows: every candidate so far, as arrays.

    ``frontier`` holds the candidate ids whose proposals the next ``expand`` takes, in the
    reference's frontier order (best first); ``expand`` is called until ``is_done`` (``depth``
    times, the first time for the root; fewer when ``min_prob`` empties the frontier), then
    ``tree`` reranks and returns the ``DraftTree``.
    """

    def __init__(self, root_token: int, depth: int, top_k: int, min_prob: float = 0.0):
        if int(depth) < 1:
            raise ValueError(f'depth: must be >= 1, got {depth}')
        if int(top_k) < 1:
            raise ValueError(f'top_k: must be >= 1, got {top_k}')
        self.top_k = int(top_k)
        self.floor = score_floor(min_prob)      # candidates below it are neither grown nor kept
        self.levels_left = int(depth)
        self.capacity = 1 + self.top_k * (1 + (self.levels_left - 1) * self.top_k)
        self.tokens = np.empty(self.capacity, dtype=np.int64)
        self.parents = np.empty(self.capacity, dtype=np.int64)
        self.depths = np.empty(self.capacity, dtype=np.int64)
        self.scores = np.empty(self.capacity, dtype=np.float64)
        self.tokens[ROOT], self.parents[ROOT], self.depths[ROOT] = int(root_token), NO_PARENT, 0
        self.scores[ROOT] = 0.0
        self.num_candidates = 1
        self.frontier = np.zeros(1, dtype=np.int64)         # [ROOT]

    @property
    def is_done(self) -> bool:
        return self.levels_left == 0

    def expand(self, logprobs, tokens) -> None:
        """Record the children of every frontier node: row j of ``logprobs`` / ``tokens`` is
        frontier node j's proposals, best first (at least ``top_k``; the first ``top_k`` are
        read), log-probabilities <= 0 (the ``expand`` contract of the reference builder,
        test/draft_tree_reference.py).
        The best ``top_k`` new candidates at or above the floor become the next frontier;
        none ends the growth."""
        if self.levels_left == 0:
            raise RuntimeError('expand: the tree has grown all its levels')
        frontier, k = self.frontier, self.top_k
        logprobs, tokens = np.asarray(logprobs), np.asarray(tokens)
        if logprobs.ndim != 2 or logprobs.shape[0] != frontier.size \
                or tokens.shape != logprobs.shape:
            raise ValueError(f'expand: returned {logprobs.shape[0] if logprobs.ndim else 0} '
                             f'rows for {frontier.size} frontier nodes')
        if logprobs.shape[1] < k:
            raise ValueError(f'expand: got {logprobs.shape[1]} candidates per node, top_k={k} '
                             'needed')
        best = logprobs[:, :k].astype(np.float64)
        # Scores must never increase along a path: that makes every kept node's parent kept.
        if not (best <= 0.0).all():         # NaN fails the comparison too
            raise ValueError('expand: log-probabilities must be <= 0 and not NaN')
        if (best[:, 1:] > best[:, :-1]).any():
            raise ValueError('expand: candidates are not sorted best first')
        scores = (self.scores[frontier][:, None] + best).ravel()
        first, last = self.num_candidates, self.num_candidates + scores.size
        self.tokens[first:last] = tokens[:, :k].ravel()
        self.parents[first:last] = np.repeat(frontier, k)
        self.depths[first:last] = np.repeat(self.depths[frontier] + 1, k)
        self.scores[first:last] = scores
        self.num_candidates = last
        frontier = first + np.argsort(-scores, kind='stable')[:k]
        self.frontier = frontier[self.scores[frontier] >= self.floor]
        self.levels_left = self.levels_left - 1 if self.frontier.size else 0

    def tree(self, max_nodes: int) -> DraftTree:
        """Rerank every candidate at or above the floor, keep the best ``max_nodes - 1``
        (ancestor-closed, checked), re-indexed in increasing candidate id."""
        if self.levels_left:
            raise RuntimeError(f'tree: {self.levels_left} levels are still to grow')
        if int(max_nodes) < 2:
            raise ValueError(f'max_nodes: must be >= 2 (root included), got {max_nodes}')
        n = self.num_candidates
        ranked = 1 + np.argsort(-self.scores[1:n], kind='stable')
        ranked = ranked[self.scores[ranked] >= self.floor]
        kept = np.sort(ranked[:int(max_nodes) - 1])
        new_index = np.full(n, -1, dtype=np.int64)
        new_index[ROOT] = ROOT
        new_index[kept] = np.arange(1, kept.size + 1)
        parents = new_index[self.parents[kept]]
        if (parents < 0).any():     # verified, not assumed: a kept node's parent must be kept
            raise RuntimeError('draft tree rerank kept a candidate without its parent')
        nodes = np.concatenate([[ROOT], kept])
        return DraftTree(tokens=tuple(self.tokens[nodes].tolist()),
                         parents=(NO_PARENT, *parents.tolist()),
                         depths=tuple(self.depths[nodes].tolist()),
                         scores=tuple(self.scores[nodes].tolist()))
