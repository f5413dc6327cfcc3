"""EAGLE-2 dynamic draft trees as plain data (no torch): the tree a verification consumes.

The trees are grown by ``tree_growth.TreeGrowth`` (arrays); the plain reference builder it is
tested against (``build_dynamic_tree``) lives with the tests (test/draft_tree_reference.py).
Follows EAGLE-2 (Li et al., 2024; docs/speculation.md, Draft tree): expand the draft model's top-k
candidates level by level, keep the top-k of each level (by cumulative log-probability) as the
next frontier, then rerank every candidate and keep the best ``max_nodes - 1``. ``min_prob``
(0 = off, EAGLE-2 exactly) prunes by confidence: a candidate whose cumulative draft probability
is below it is neither expanded nor kept, and growth stops at the first level with no candidate
left to expand (docs/speculation.md, Confidence pruning).

A ``DraftTree`` is what one verification forward consumes:
- node 0 is the root: the last token already decided, whose KV is not yet in the verifier cache;
- nodes are ordered so that a parent always has a smaller index than its children;
- a node attends to its ancestors and itself: ``step_inputs.ancestor_mask(tree.parents)``, the
  one builder of tree masks;
- ``depths`` are the position offsets. The verifier position of node i is
  ``history_len + depths[i]`` where ``history_len`` counts the request's FULL prefix (BOS, image
  patch tokens, text and tokens decided so far). The draft's own tree positions are counted
  the same way; Spec-VLA's draft computed them from the text tokens only, leaving the image out
  (docs/speculation.md, Draft tree), which is deliberately not reproduced.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

from ..tree_nodes import NO_PARENT, ROOT


def _path_to(parents: Sequence[int], node: int) -> list[int]:
    """``node``'s ancestors from the root down, then ``node`` itself."""
    path = []
    while node != NO_PARENT:
        path.append(node)
        node = parents[node]
    return path[::-1]


@dataclass(frozen=True)
class DraftTree:
    """An immutable draft tree; field i describes node i (root = node 0)."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]    # parents[0] == NO_PARENT, 0 <= parents[i] < i otherwise
    depths: tuple[int, ...]     # depths[0] == 0, depths[i] == depths[parents[i]] + 1
    scores: tuple[float, ...]   # cumulative draft log-probability, scores[0] == 0.0

    def __post_init__(self):
        for name in ('tokens', 'parents', 'depths'):
            object.__setattr__(self, name, tuple(int(x) for x in getattr(self, name)))
        object.__setattr__(self, 'scores', tuple(float(x) for x in self.scores))
        num_nodes = len(self.tokens)
        if num_nodes == 0:
            raise ValueError('tokens: a draft tree needs at least the root node')
        for name in ('parents', 'depths', 'scores'):
            if len(getattr(self, name)) != num_nodes:
                raise ValueError(f'{name}: length {len(getattr(self, name))} != '
                                 f'{num_nodes} nodes')
        if self.parents[ROOT] != NO_PARENT:
            raise ValueError(f'parents: the root must have parent {NO_PARENT}')
        if self.depths[ROOT] != 0:
            raise ValueError('depths: the root must have depth 0')
        if self.scores[ROOT] != 0.0:
            raise ValueError('scores: the root must have score 0.0')
        for i in range(1, num_nodes):
            parent = self.parents[i]
            if not 0 <= parent < i:
                raise ValueError(f'parents: node {i} has parent {parent}; '
                                 'parents must precede their children')
            if self.depths[i] != self.depths[parent] + 1:
                raise ValueError(f'depths: node {i} has depth {self.depths[i]}, '
                                 f'its parent {parent} has {self.depths[parent]}')

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def max_depth(self) -> int:
        """Number of draft levels actually present (0 for a root-only tree)."""
        return max(self.depths)

    @cached_property
    def _children(self) -> tuple[tuple[int, ...], ...]:
        children: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i in range(1, self.num_nodes):
            children[self.parents[i]].append(i)
        return tuple(tuple(c) for c in children)

    def children(self, node: int) -> tuple[int, ...]:
        """Children of ``node`` in increasing index order."""
        return self._children[node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to ``node`` (both included)."""
        return _path_to(self.parents, node)


def chain_tree(root_token: int, tokens: Sequence[int],
               logprobs: Sequence[float] | None = None) -> DraftTree:
    """A single-path tree: root -> tokens[0] -> tokens[1] -> ... (oracle drafts, tests).

    ``logprobs`` (one per drafted token) default to 0.0, i.e. a draft certain of every token.
    """
    if logprobs is None:
        logprobs = [0.0] * len(tokens)
    if len(logprobs) != len(tokens):
        raise ValueError(f'logprobs: length {len(logprobs)} != {len(tokens)} tokens')
    scores = [0.0]
    for logprob in logprobs:
        scores.append(scores[-1] + float(logprob))
    num_nodes = len(tokens) + 1
    return DraftTree(tokens=(root_token, *tokens), parents=(NO_PARENT, *range(num_nodes - 1)),
                     depths=tuple(range(num_nodes)), scores=tuple(scores))


def score_floor(min_prob: float) -> float:
    """The cumulative log-probability a candidate needs under ``min_prob`` (checked to lie in
    [0, 1]): ``log(min_prob)``, or -inf for 0 (every candidate, -inf scores included)."""
    min_prob = float(min_prob)
    if not 0.0 <= min_prob <= 1.0:      # NaN fails the comparison too
        raise ValueError(f'min_prob: must lie in [0, 1], got {min_prob}')
    return math.log(min_prob) if min_prob > 0.0 else -math.inf
