"""The plain reference builder of EAGLE-2 dynamic draft trees (test oracle, no torch).

``build_dynamic_tree`` grows a tree level by level from an ``expand`` callback, one candidate
at a time in plain Python: the rule ``engine/drafting/tree_growth.TreeGrowth`` implements with
arrays, and what the tests compare it to bit for bit. It is not shipped in the package.
"""
from __future__ import annotations

import math
from typing import Callable, Generator, Sequence

from vla_spec_ros.engine.drafting.draft_tree import (NO_PARENT, ROOT, DraftTree, _path_to,
                                                     score_floor)

# expand(partial, frontier) -> per frontier node, (token, logprob) candidates, best first.
ExpandFn = Callable[['PartialTree', Sequence[int]], Sequence[Sequence[tuple[int, float]]]]


class PartialTree:
    """Every candidate proposed so far while a tree is built, indexed by candidate id.

    Candidate 0 is the root; later ids are assigned in creation order (level by level, frontier
    order, then the draft's rank), so a parent's id is always smaller than its children's. The
    lists are read-only for ``expand``; ``path_to`` gives the candidate ids an expanded node may
    attend to among the candidates (its ancestors and itself).
    """

    def __init__(self, root_token: int):
        self.tokens: list[int] = [int(root_token)]
        self.parents: list[int] = [NO_PARENT]
        self.depths: list[int] = [0]
        self.scores: list[float] = [0.0]

    @property
    def num_candidates(self) -> int:
        return len(self.tokens)

    def path_to(self, node: int) -> list[int]:
        return _path_to(self.parents, node)

    def _add(self, parent: int, token: int, logprob: float) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.scores.append(self.scores[parent] + logprob)
        return len(self.tokens) - 1


def _top_candidates(proposals, node: int, top_k: int) -> list[tuple[int, float]]:
    """Validate one frontier node's proposals and return its first ``top_k`` as (int, float)."""
    if len(proposals) < top_k:
        raise ValueError(f'expand: node {node} got {len(proposals)} candidates, '
                         f'top_k={top_k} needed')
    best = []
    for token, logprob in list(proposals)[:top_k]:
        logprob = float(logprob)
        # Scores must never increase along a path: that makes every kept node's parent kept.
        if math.isnan(logprob) or logprob > 0.0:
            raise ValueError(f'expand: node {node} got log-probability {logprob}; '
                             'log-probabilities must be <= 0 and not NaN')
        if best and logprob > best[-1][1]:
            raise ValueError(f'expand: candidates of node {node} are not sorted best first')
        best.append((int(token), logprob))
    return best


def grow_dynamic_tree(root_token: int, depth: int, top_k: int, max_nodes: int,
                      min_prob: float = 0.0) -> Generator[tuple['PartialTree', list[int]],
                                                          Sequence, DraftTree]:
    """``build_dynamic_tree`` as a generator, so that many trees grow in lock-step.

    Yields ``(partial, frontier)`` at most ``depth`` times (exactly ``depth`` times when
    ``min_prob`` is 0) and expects the proposals for that frontier to be sent back (the
    ``expand`` contract of ``build_dynamic_tree``); returns the ``DraftTree``
    (``StopIteration.value``). The engine drives the trees of every in-flight request together
    and answers each level with ONE batched draft forward.
    """
    if int(depth) < 1:
        raise ValueError(f'depth: must be >= 1, got {depth}')
    if int(top_k) < 1:
        raise ValueError(f'top_k: must be >= 1, got {top_k}')
    if int(max_nodes) < 2:
        raise ValueError(f'max_nodes: must be >= 2 (root included), got {max_nodes}')
    floor = score_floor(min_prob)
    partial = PartialTree(root_token)

    def rank_key(node: int) -> tuple[float, int]:
        return (-partial.scores[node], node)

    # 1. Level by level: expand the frontier, record every proposed child as a candidate.
    frontier = [ROOT]
    for _ in range(depth):
        proposals = yield partial, list(frontier)
        if len(proposals) != len(frontier):
            raise ValueError(f'expand: returned {len(proposals)} rows for '
                             f'{len(frontier)} frontier nodes')
        level = []
        for node, node_proposals in zip(frontier, proposals):
            for token, logprob in _top_candidates(node_proposals, node, top_k):
                level.append(partial._add(node, token, logprob))
        # 2. The best top_k of the new level become the next frontier, if confident enough.
        frontier = [node for node in sorted(level, key=rank_key)[:top_k]
                    if partial.scores[node] >= floor]
        if not frontier:
            break

    # 3. Rerank every confident candidate; the prefix of this order is ancestor-closed (see
    #    docstring), and so is the confident set: a child's score never exceeds its parent's.
    confident = [node for node in range(1, partial.num_candidates)
                 if partial.scores[node] >= floor]
    kept = sorted(sorted(confident, key=rank_key)[:max_nodes - 1])
    new_index = {ROOT: ROOT}
    for i, node in enumerate(kept, start=1):
        new_index[node] = i
    nodes = [ROOT, *kept]
    for node in kept:   # verified, not assumed: a kept node's parent must be kept
        if partial.parents[node] not in new_index:
            raise RuntimeError(f'draft tree rerank kept candidate {node} without its parent')
    return DraftTree(
        tokens=tuple(partial.tokens[n] for n in nodes),
        parents=tuple(NO_PARENT if n == ROOT else new_index[partial.parents[n]] for n in nodes),
        depths=tuple(partial.depths[n] for n in nodes),
        scores=tuple(partial.scores[n] for n in nodes),
    )


def build_dynamic_tree(root_token: int, expand: ExpandFn, depth: int, top_k: int,
                       max_nodes: int, min_prob: float = 0.0) -> DraftTree:
    """Build an EAGLE-2 dynamic draft tree.

    Args:
        root_token: the last decided token (node 0).
        expand: ``expand(partial, frontier) -> proposals``. ``partial`` is the ``PartialTree``
            of all candidates so far; ``frontier`` lists candidate ids to expand (the first call
            is ``[0]``, the root; later calls hold at most ``top_k`` ids of the newest level, in
            frontier order). ``proposals[j]`` is the draft model's distribution for the token
            after frontier node j (i.e. from the draft's output at that node, whose input is
            the node's token and its parent's draft feature), given as ``(token, logprob)``
            pairs sorted by logprob descending, at least ``top_k`` of them (only the first
            ``top_k`` are read), log-probabilities <= 0 (normalised, e.g. log_softmax). The
            engine runs the whole frontier in one batched draft forward. It is called
            ``depth`` times, fewer when ``min_prob`` empties a frontier.
        depth: number of draft levels (maximum draft length), >= 1.
        top_k: children proposed per expanded node and frontier size per level, >= 1.
        max_nodes: tree size including the root, >= 2 (an upper bound: pruning may leave
            fewer nodes, down to the root alone).
        min_prob: confidence pruning in [0, 1]: only candidates whose cumulative draft
            probability ``exp(score)`` is at least this are expanded and kept (compared as
            ``score >= log(min_prob)``); 0 keeps every candidate (EAGLE-2 as published).

    Ties: candidates are ranked by the key ``(-score, candidate id)``: on equal cumulative
    score the earlier-created candidate wins. This applies to the next frontier and to the final
    rerank. Since a child's score never exceeds its parent's and a parent is created first, a
    parent always ranks ahead of its children, so the kept set is closed under ancestors.
    The kept candidates are re-indexed in increasing candidate id (root first, parents before
    children).
    """
    trees = grow_dynamic_tree(root_token, depth, top_k, max_nodes, min_prob)
    request = next(trees)
    while True:
        try:
            request = trees.send(expand(*request))
        except StopIteration as done:
            return done.value
