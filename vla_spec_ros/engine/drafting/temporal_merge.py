"""A draft model's trees with each stream's previous action merged in (``draft_previous_action``).

Temporal drafting (engine/drafting/previous_action_drafter.py) costs no draft forward and is right
where the policy repeats itself; a draft head (EAGLE) is right where it predicts a change. Verified
together they accept the longer of the two: ``WithPreviousAction`` asks the draft model for its
tree with room left for the chain, then merges the chain in as a path from the root
(``merge_chain``): where the tree already holds the chain's next token it follows that node, and
from the first token it lacks, the rest of the chain hangs below as new nodes. The verifier checks
the merged tree like any other: at ``relax_threshold`` 0 the tokens are greedy decoding's.

Plain Python (no torch): the draft model's forwards stay its own.
"""
from __future__ import annotations

from typing import Sequence

from .draft_tree import DraftTree
from .drafter import Drafter
from .previous_action_drafter import PreviousActionDrafter


def merge_chain(tree: DraftTree, chain: Sequence[int]) -> DraftTree:
    """``tree`` plus the path root -> chain[0] -> chain[1] -> ...: existing nodes are followed,
    missing ones appended (after every node of ``tree``, so parents still precede children;
    the nodes of ``tree`` keep their indices). An appended node carries its parent's score (the
    chain has no probabilities)."""
    tokens, parents = list(tree.tokens), list(tree.parents)
    depths, scores = list(tree.depths), list(tree.scores)
    children = {}
    for node in range(1, len(tokens)):
        children.setdefault((parents[node], tokens[node]), node)
    node = 0
    for token in chain:
        token = int(token)
        child = children.get((node, token))
        if child is None:
            child = len(tokens)
            tokens.append(token)
            parents.append(node)
            depths.append(depths[node] + 1)
            scores.append(scores[node])
            children[(node, token)] = child
        node = child
    if len(tokens) == tree.num_nodes:
        return tree
    return DraftTree(tokens=tokens, parents=parents, depths=depths, scores=scores)


class WithPreviousAction(Drafter):
    """``model``'s trees with each stream's previous action merged in; the chain comes from a
    ``PreviousActionDrafter`` fed the same updates. A tree keeps at most ``max_nodes`` nodes:
    the model is asked for ``max_nodes`` minus the chain's length (at least 2: the root and one
    candidate), and the chain is cut to what then fits."""

    def __init__(self, model: Drafter, max_tokens: int, step_tokens: int | None = None):
        self.model = model
        self.temporal = PreviousActionDrafter(max_tokens, step_tokens)

    @property
    def num_forward_passes(self) -> int:
        return self.model.num_forward_passes

    @property
    def forward_s(self) -> float:
        return self.model.forward_s

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        # Both change together or neither: the chain's checks first, then the model's update
        # (which checks before it changes anything), then the chain's, which cannot fail now.
        self.temporal.check_update(begins, advances)
        self.model.update(begins, advances, features)
        self.temporal.update(begins, advances, features)

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        chains = [t.tokens[1:] for t in self.temporal.propose_batch(
            request_ids, depths, top_k, max_nodes, min_prob)]
        # One model call per chain length: every request of a call gets the same node budget.
        by_budget: dict[int, list[int]] = {}
        for i, chain in enumerate(chains):
            by_budget.setdefault(max(2, max_nodes - len(chain)), []).append(i)
        trees: list[DraftTree | None] = [None] * len(request_ids)
        for budget, members in by_budget.items():
            batch = self.model.propose_batch([request_ids[i] for i in members],
                                             [depths[i] for i in members], top_k, budget,
                                             min_prob)
            for i, tree in zip(members, batch):
                trees[i] = tree
        return [merge_chain(tree, chain[:max(0, max_nodes - tree.num_nodes)])
                for tree, chain in zip(trees, chains)]

    @property
    def has_prefill_draft(self) -> bool:
        return True

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        """The chain part needs no features: it rides the prefill (speculative prefill)."""
        return self.temporal.prefill_draft(stream_id, max_len, step)

    def release(self, request_id) -> None:
        self.temporal.release(request_id)
        self.model.release(request_id)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        self.temporal.observe_action(stream_id, tokens, request_id, step)
        self.model.observe_action(stream_id, tokens, request_id, step)

    def forget_stream(self, stream_id: str | None) -> None:
        self.temporal.forget_stream(stream_id)
        self.model.forget_stream(stream_id)

    def capture_graphs(self, prefix_len: int, tree_depth: int, top_k: int) -> int:
        return self.model.capture_graphs(prefix_len, tree_depth, top_k)


__all__ = ['merge_chain', 'WithPreviousAction']
