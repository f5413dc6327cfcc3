"""Drafters: who proposes the draft tree of each speculative round (the interface).

Per engine step the speculative strategy (engine/packed.py) asks the drafter for the trees it
verifies (``propose_batch``), then hands back what the verifier decided (``update``: new
prompts and accepted paths, with the verifier's features). Two implementations:
``engine/eagle_drafter.EagleDrafter`` runs the EAGLE draft head, batched across in-flight
requests; ``engine/previous_action_drafter.PreviousActionDrafter`` proposes each stream's
previous action (temporal drafting, no draft model); ``vla_spec_ros.testing.OracleDrafter``, a
test and benchmark double, proposes the AR reference tokens.
"""
from __future__ import annotations

from ...validation import check_int

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from .draft_tree import DraftTree

if TYPE_CHECKING:       # annotations only: the interface itself needs no torch
    import torch


@dataclass(frozen=True)
class DraftBegin:
    """After a prefill: the prefix's embeddings (L, H), the rows of the features tensor that
    hold the verifier's f_0..f_{L-1}, and the root (the verifier's argmax at L-1).
    ``prefix_embeds`` is None for a drafter that reads no features (``Drafter.needs_features``
    False): the engine does not build what nobody reads.

    With speculative prefill the prefill block also carried a drafted chain: the ``m`` chain
    tokens it accepted are ``decided_before_root`` (the request's first m action tokens), the
    prefix is the prompt followed by those tokens (their embeddings and verifier features are
    its last m rows), and the root is the token the verifier decided after them."""

    request_id: int
    prefix_embeds: torch.Tensor | None
    feature_rows: Sequence[int]
    root_token: int
    stream_id: str = ''             # the request's camera stream (temporal drafting needs it)
    decided_before_root: tuple[int, ...] = ()
    step: int | None = None         # the control step of the frame's image, when known


@dataclass(frozen=True)
class DraftAdvance:
    """After a verification: path_tokens = [root, n1..nk] (the accepted path), the features
    rows holding the verifier outputs at those nodes, bonus = the new root."""

    request_id: int
    path_tokens: Sequence[int]
    feature_rows: Sequence[int]
    bonus: int


class Drafter:
    """What the speculative engine calls; batched over every in-flight request.

    Per engine step: ``propose_batch`` (the trees verified in this step), then ``update`` with
    the step's prefills (``begins``) and accepted paths (``advances``), reading the verifier's
    features from one tensor. (One-request forms of these, for tests, are in
    test/helpers.py.)
    """

    num_forward_passes: int = 0     # draft forwards so far (stats)
    forward_s: float = 0.0          # seconds inside them, up to their host reads (stats)

    def update(self, begins: Sequence[DraftBegin], advances: Sequence[DraftAdvance],
               features: torch.Tensor) -> None:
        raise NotImplementedError

    def propose_batch(self, request_ids: Sequence[int], depths: Sequence[int], top_k: int,
                      max_nodes: int, min_prob: float = 0.0) -> list[DraftTree]:
        """One tree per request, rooted at its current root (node 0), at most depths[i] draft
        levels and ``max_nodes`` nodes including the root, none of them (the root aside) with
        a cumulative draft probability below ``min_prob`` (EAGLE-2's rule,
        docs/speculation.md)."""
        raise NotImplementedError

    def release(self, request_id: int) -> None:
        raise NotImplementedError

    @property
    def needs_features(self) -> bool:
        """Whether ``update`` reads ``DraftBegin.prefix_embeds`` and the verifier's features
        (a draft head does). When False the engine hands ``prefix_embeds=None`` and skips
        embedding the prefix: a drafter that drafts from decided tokens alone needs neither."""
        return True

    @property
    def has_prefill_draft(self) -> bool:
        """Whether ``prefill_draft`` can propose anything (the engine then reserves room for
        a chain in every prefill block)."""
        return False

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        """The first ``max_len`` (at most) action tokens a new frame of ``stream_id`` (image
        taken at control ``step``, when known) is expected to decide, known before its
        prefill (no verifier features needed): the engine appends them to the frame's prefill
        block and the one forward that prefills the frame verifies them too (speculative
        prefill). Default: none (a draft head needs the prefill's features first)."""
        return []

    @property
    def derives_depth(self) -> bool:
        """True when the drafter's trees are bounded by what it knows, not by ``tree_depth``
        (the previous action's chain): the engine then asks for every remaining token."""
        return False

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        """Every action as soon as the engine has decided it (its tokens, the request's id,
        the control step of its image when known; frames of a stream may finish out of
        submission order): a drafter that drafts from past actions keeps what it needs
        (default: nothing)."""

    def forget_stream(self, stream_id: str | None) -> None:
        """The stream (None: every stream) was reset: forget what ``observe_action`` gave."""

    def capture_graphs(self, prefix_len: int, tree_depth: int, top_k: int) -> int:
        """Build, before serving, the forward shapes that trees over a prompt of
        ``prefix_len`` rows can meet (CUDA graphs); returns the number built (none here)."""
        return 0


__all__ = ['DraftAdvance', 'DraftBegin', 'Drafter']


def check_proposal(request_ids, depths, top_k, max_nodes) -> tuple[list[int], int]:
    """``propose_batch``'s arguments checked (ValueError naming the field): -> (one depth per
    request, max_nodes)."""
    check_int('top_k', top_k, minimum=1)
    max_nodes = check_int('max_nodes', max_nodes, minimum=2)
    if len(request_ids) != len(depths):
        raise ValueError(f'depths: one per request, got {len(depths)} for '
                         f'{len(request_ids)} requests')
    return [check_int('depth', depth, minimum=1) for depth in depths], max_nodes


def check_path_from_root(advance: 'DraftAdvance', root: int) -> list[int]:
    """An advance's accepted path, which must start with its request's current root."""
    path = [int(t) for t in advance.path_tokens]
    if not path or path[0] != root:
        raise ValueError(f'path_tokens: must start with the current root {root}, got '
                         f'{path[:1]}')
    return path
