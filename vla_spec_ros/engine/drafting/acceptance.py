"""Verification outcome of one draft tree: exact (EAGLE) or relaxed (Spec-VLA) acceptance.

Implements S4 (docs/architecture.md), following EAGLE-2's greedy ``evaluate_posterior`` and
Spec-VLA's relaxed rule (docs/speculation.md, Acceptance) with two deliberate differences from
Spec-VLA:
relaxation compares action-token bins and never applies to non-action tokens (Spec-VLA compared
raw ids), and ties between equally long paths go to the smallest summed bin distance (Spec-VLA
took the first leaf).

The acceptance rule, for a draft node c with parent p, where v = verifier_argmax[p] is the
verifier's greedy token for the position of c:
    accepted  iff  tokens[c] == v
              or  (r > 0 and tokens[c], v are both action tokens
                   and |bin(tokens[c]) - bin(v)| <= r).
For a codec whose output is text then an action (a reasoning policy: ``action_marker`` names the
tokens that open the action), relaxation applies only to nodes after the marker, i.e. when the
decided tokens and the path above the node contain it; reasoning tokens are accepted only when
exact, whatever ids they are.
A path is accepted up to its first rejected node. The draft token is kept (the verifier's later
outputs on that path were computed from it); the bonus token after the path is the verifier's
exact argmax at the last accepted node, never relaxed.

Forced tokens (``forced``, the lossy reuse of a previous reasoning: engine/reasoning_reuse.py):
the output must continue with them whatever the verifier says. A node at depth d <= len(forced)
is accepted iff its token is forced[d - 1]; deeper nodes follow the rule above; and while the
path ends inside the forced tokens, the bonus is the next forced token, not the verifier's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from vla_spec_ros.engine.drafting.draft_tree import ROOT, DraftTree
from vla_spec_ros.validation import check_int


@dataclass(frozen=True)
class Acceptance:
    """The chosen path of one verified tree."""

    accepted_nodes: tuple[int, ...]    # tree node indices along the path, root excluded
    accepted_tokens: tuple[int, ...]   # the draft tokens at those nodes, as drafted
    bonus_token: int                   # verifier argmax at the last accepted node (or root)
    bin_distance_sum: int              # summed |bin distance| over accepted nodes (exact = 0)

    @property
    def num_accepted(self) -> int:
        return len(self.accepted_nodes)

    @property
    def path_nodes(self) -> tuple[int, ...]:
        """Root + accepted nodes: the tree nodes whose verifier KV is kept (compaction order)."""
        return (ROOT, *self.accepted_nodes)

    @property
    def emitted_tokens(self) -> tuple[int, ...]:
        """Accepted draft tokens followed by the bonus token."""
        return (*self.accepted_tokens, self.bonus_token)


def accept(tree: DraftTree, verifier_argmax: Sequence[int], *, relax_threshold: int,
           is_action_token: Callable[[int], bool],
           token_to_bin: Callable[[int], int], action_marker: Sequence[int] = (),
           decided: Sequence[int] = (), forced: Sequence[int] = ()) -> Acceptance:
    """Choose the accepted path of ``tree`` given the verifier's greedy tokens.

    Args:
        tree: the verified draft tree.
        verifier_argmax: (num_nodes,) ``verifier_argmax[i]`` is the verifier's greedy token at
            node i, i.e. its prediction for the position of node i's children.
        relax_threshold: r >= 0 in bins; 0 means exact matching (greedy EAGLE, S3).
        is_action_token: whether a token id is an action token.
        token_to_bin: the action bin of an action token (called only on action tokens).
        action_marker: the tokens after which the action starts; empty: every position may
            be relaxed (a codec whose whole output is the action).
        decided: the request's output tokens decided before the tree's drafted nodes (its root
            last when the root is an output token; empty for a prefill's chain).
        forced: the tokens the output must continue with from the first drafted node on
            (module docstring); empty: none.

    Path choice: the deepest accepted node wins; on equal depth the smallest summed bin
    distance; then the path whose node-index sequence (root to end) is lexicographically
    smallest, i.e. the lowest node indices.
    """
    if len(verifier_argmax) != tree.num_nodes:
        raise ValueError(f'verifier_argmax: length {len(verifier_argmax)} != '
                         f'{tree.num_nodes} tree nodes')
    relax_threshold = check_int('relax_threshold', relax_threshold, minimum=0)
    argmax = [int(t) for t in verifier_argmax]
    in_action = _action_part(tree, action_marker, decided) if relax_threshold > 0 else None

    # 1. Per node: is the path root..node accepted, and its summed bin distance.
    forced = [int(t) for t in forced]
    path_distance = _path_distances(tree, argmax, relax_threshold, in_action, is_action_token,
                                    token_to_bin, forced)
    # 2. The best accepted node by (deepest, smallest distance, lowest node indices).
    best_node = _best_node(tree, path_distance)
    nodes = tuple(tree.path_to(best_node)[1:])
    bonus = forced[len(nodes)] if len(nodes) < len(forced) else argmax[best_node]
    return Acceptance(accepted_nodes=nodes,
                      accepted_tokens=tuple(tree.tokens[n] for n in nodes),
                      bonus_token=bonus, bin_distance_sum=path_distance[best_node])


def _path_distances(tree: DraftTree, argmax: list[int], relax_threshold: int, in_action,
                    is_action_token: Callable[[int], bool],
                    token_to_bin: Callable[[int], int], forced: list[int]
                    ) -> list[int | None]:
    """Per node, in index order (parents first): the summed bin distance along root..node when
    that path is accepted, None when it was rejected (the root: 0). A node is accepted when its
    parent's path is and its token is the verifier's at the parent, or, relaxed, an action token
    within ``relax_threshold`` bins of it in the action part (``in_action``); a node within
    the ``forced`` depth is accepted iff it is the forced token there."""
    path_distance: list[int | None] = [0] + [None] * (tree.num_nodes - 1)
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        if path_distance[parent] is None:
            continue
        draft, target = tree.tokens[node], argmax[parent]
        depth = tree.depths[node]
        if depth <= len(forced):
            if draft == forced[depth - 1]:
                path_distance[node] = path_distance[parent]
            continue
        if draft == target:
            distance = 0
        elif (relax_threshold > 0 and in_action[parent] and is_action_token(draft)
              and is_action_token(target)):
            distance = abs(int(token_to_bin(draft)) - int(token_to_bin(target)))
            if distance > relax_threshold:
                continue
        else:
            continue
        path_distance[node] = path_distance[parent] + distance
    return path_distance


def _best_node(tree: DraftTree, path_distance: list[int | None]) -> int:
    """The accepted node ending the chosen path: the deepest, then the smallest summed
    distance, then the lowest node indices (root to end)."""
    best_key, best_node = None, ROOT
    for node, distance in enumerate(path_distance):
        if distance is None:
            continue
        key = (-tree.depths[node], distance, tree.path_to(node))
        if best_key is None or key < best_key:
            best_key, best_node = key, node
    return best_node


def _action_part(tree: DraftTree, marker: Sequence[int], decided: Sequence[int]) -> list[bool]:
    """Per node p: whether the children of p stand in the action part (the marker lies in the
    decided tokens or on the path root..p); all True without a marker."""
    if not marker:
        return [True] * tree.num_nodes
    marker, decided = [int(t) for t in marker], [int(t) for t in decided]
    m = len(marker)
    started = [any(decided[i:i + m] == marker for i in range(len(decided) - m + 1))]
    for node in range(1, tree.num_nodes):
        parent = tree.parents[node]
        if started[parent]:
            started.append(True)
            continue
        # The last m output tokens up to this node: decided, then its path below the root.
        path = [tree.tokens[n] for n in tree.path_to(node)[1:]]
        started.append((decided[-m:] + path)[-m:] == marker)
    return started


def truncate(acc: Acceptance, max_new_tokens: int) -> tuple[int, ...]:
    """The tokens a request emits this round when only ``max_new_tokens`` remain (>= 1).

    Emitted = the accepted draft tokens in path order, then the bonus token, cut to the first
    ``max_new_tokens``. If ``max_new_tokens <= acc.num_accepted`` the bonus token and any
    accepted drafts beyond the limit are dropped; the request is then complete, so no KV needs
    compacting for it.
    """
    max_new_tokens = check_int('max_new_tokens', max_new_tokens, minimum=1)
    return acc.emitted_tokens[:max_new_tokens]
