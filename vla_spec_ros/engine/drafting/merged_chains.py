"""Several headless drafts in one tree: each drafter's chain merged in as a path from the root
(``temporal_merge.merge_chain``), so one verification accepts the longest right prefix of any
of them (``draft_path: shifted_chunk+previous_action``, names joined by ``+``).

The first drafter's chain is laid down first and is the prefill draft (a prefill block carries
one chain); the others hang below the root where they part from it. Each drafter gets every
update and sees every action; a tree keeps at most ``max_nodes`` nodes (later chains are cut to
what fits). Plain Python (no torch).
"""
from __future__ import annotations

from typing import Sequence

from .draft_tree import DraftTree
from .drafter import Drafter
from .temporal_merge import merge_chain

DRAFT_SEPARATOR = '+'


def _shared_prefix(tree: DraftTree, chain: Sequence[int]) -> int:
    """How many leading tokens of ``chain`` are a path from the root of ``tree``."""
    children = {(tree.parents[n], tree.tokens[n]): n for n in range(1, tree.num_nodes)}
    node = 0
    for count, token in enumerate(chain):
        node = children.get((node, int(token)))
        if node is None:
            return count
    return len(chain)


class MergedChains(Drafter):
    def __init__(self, drafters: Sequence[Drafter]):
        self.drafters = list(drafters)
        if len(self.drafters) < 2:
            raise ValueError(f'drafters: merging needs at least two, got {len(self.drafters)}')
        for d in self.drafters:
            if d.needs_features or not d.derives_depth:
                raise ValueError(f'drafters: {type(d).__name__} is not a headless chain '
                                 'drafter (needs features or a tree depth)')

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        for d in self.drafters:        # every check first: all change together or none
            d.check_update(begins, advances)
        for d in self.drafters:
            d.update(begins, advances, features)

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        per_drafter = [d.propose_batch(request_ids, depths, top_k, max_nodes, min_prob)
                       for d in self.drafters]
        trees = []
        for i in range(len(request_ids)):
            tree = per_drafter[0][i]
            for other in per_drafter[1:]:
                chain = other[i].tokens[1:]
                # Its leading tokens already in the tree add no node; the rest must fit.
                shared = _shared_prefix(tree, chain)
                tree = merge_chain(tree, chain[:shared + max(0, max_nodes - tree.num_nodes)])
            trees.append(tree)
        return trees

    @property
    def needs_features(self) -> bool:
        return False

    @property
    def has_prefill_draft(self) -> bool:
        return self.drafters[0].has_prefill_draft

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        return self.drafters[0].prefill_draft(stream_id, max_len, step)

    @property
    def derives_depth(self) -> bool:
        return True

    def release(self, request_id) -> None:
        for d in self.drafters:
            d.release(request_id)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        for d in self.drafters:
            d.observe_action(stream_id, tokens, request_id, step)

    def forget_stream(self, stream_id: str | None) -> None:
        for d in self.drafters:
            d.forget_stream(stream_id)


__all__ = ['DRAFT_SEPARATOR', 'MergedChains']
