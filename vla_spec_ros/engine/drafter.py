"""Drafters: who proposes the draft tree of each speculative round.

``EagleDrafter`` runs the EAGLE draft head (models/draft.py) over a private per-request KV cache
and grows an EAGLE-2 dynamic tree (engine/draft_tree.py) with one batched draft forward per
level (reference/eagle_specvla.md §3). ``OracleDrafter`` proposes the AR reference tokens,
optionally corrupted at a controlled rate (tests and benchmarks of the verifier side).

Draft positions (Spec-VLA layout, the full multimodal prefix included; Spec-VLA's text-only
position offset is deliberately not reproduced):
- stable position p holds fc(cat(e_{p+1}, f_p)) in slot p. After ``begin`` the stable positions
  are 0..L-1 (e_L = the root's embedding); each ``advance`` appends one position per accepted
  path node, pairing f(path[i]) with the embedding of the next decided token.
- tree node at depth d >= 1 (token x, parent q) sits at position (stable_len - 1) + d in a
  scratch slot >= stable_len; its input is fc(cat(embed(x), h_q)) with h_q the draft output of
  q (the last stable output for depth 1), and it attends to the stable prefix, its ancestors and
  itself. Scratch slots are overwritten by the next ``advance``; stable slots never are.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..models.layers import KVCache, StepBatch
from .ar import causal_batch
from .draft_tree import ROOT, DraftTree, PartialTree, build_dynamic_tree, chain_tree

MAX_FREE_CACHES = 8         # released draft caches kept for reuse (no allocation per request)


class Drafter:
    """Interface the speculative engine calls, once per request and round."""

    num_forward_passes: int = 0     # draft forwards so far (stats)

    def begin(self, request_id: int, prefix_embeds: torch.Tensor,
              prefix_features: torch.Tensor, root_token: int) -> None:
        """After the prefill: prefix_embeds / prefix_features (L, H) = e_0..e_{L-1} and the
        verifier's final-normed f_0..f_{L-1}; root_token = a1, the verifier's argmax at L-1."""
        raise NotImplementedError

    def propose(self, request_id: int, depth: int, top_k: int, max_nodes: int) -> DraftTree:
        """A tree rooted at the current root (node 0), at most ``depth`` draft levels and
        ``max_nodes`` nodes including the root."""
        raise NotImplementedError

    def advance(self, request_id: int, path_tokens: Sequence[int], path_features: torch.Tensor,
                bonus: int) -> None:
        """After verification: path_tokens = [root, n1..nk] (accepted path), path_features
        (k+1, H) the verifier outputs at those nodes, bonus = the new root."""
        raise NotImplementedError

    def release(self, request_id: int) -> None:
        raise NotImplementedError


@dataclass
class _DraftState:
    cache: KVCache
    stable_len: int             # draft positions 0..stable_len-1 are stable (slot == position)
    root_token: int
    root_hidden: torch.Tensor   # (H,) draft output at position stable_len - 1


def _check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f'{name}: must be an integer >= {minimum}, got {value!r}')
    return int(value)


class EagleDrafter(Drafter):
    """EAGLE-2 drafting with an ``EagleDraftHead`` (one private KV cache per request)."""

    def __init__(self, runner, head, max_tree_nodes: int = 64, slot_margin: int = 16):
        self.head = head
        self.action_dim = int(runner.action_dim)
        self.max_tree_nodes = _check_count('max_tree_nodes', max_tree_nodes, 1)
        self.slot_margin = _check_count('slot_margin', slot_margin, 0)
        self.hidden_size = head.cfg.hidden_size
        self.max_positions = head.cfg.max_position_embeddings
        self._states: dict[int, _DraftState] = {}
        self._free_caches: list[KVCache] = []
        self.num_forward_passes = 0

    # ---- lifecycle ----------------------------------------------------------------------------

    @torch.no_grad()
    def begin(self, request_id, prefix_embeds, prefix_features, root_token) -> None:
        if request_id in self._states:
            raise ValueError(f'request_id: {request_id} already has a draft state; release it '
                             'first')
        length = self._check_rows('prefix_embeds', prefix_embeds, None)
        self._check_rows('prefix_features', prefix_features, length)
        self._check_position(length - 1)
        device = self.head.fc.weight.device
        cache = self._take_cache(length + self.action_dim + self.max_tree_nodes
                                 + self.slot_margin)
        # Draft input at p pairs f_p with e_{p+1}: the prefix embeddings shifted by one, then
        # the root's embedding at p = L-1.
        root = self._embed([root_token])
        inputs = torch.cat([prefix_embeds[1:], root], dim=0)                     # (L, H)
        hidden = self._forward(inputs, prefix_features, causal_batch(0, length, device), cache)
        self._states[request_id] = _DraftState(cache, length, int(root_token), hidden[-1])

    @torch.no_grad()
    def advance(self, request_id, path_tokens, path_features, bonus) -> None:
        state = self._state(request_id)
        path = [int(t) for t in path_tokens]
        if not path or path[0] != state.root_token:
            raise ValueError(f'path_tokens: must start with the current root '
                             f'{state.root_token}, got {path[:1]}')
        count = self._check_rows('path_features', path_features, len(path))
        self._check_position(state.stable_len + count - 1)
        self._ensure_slots(state, state.stable_len + count)
        # New stable positions: f(path[i]) with the embedding of the token decided after it.
        inputs = self._embed(path[1:] + [int(bonus)])                            # (k+1, H)
        batch = causal_batch(state.stable_len, count, inputs.device)
        hidden = self._forward(inputs, path_features, batch, state.cache)
        state.stable_len += count
        state.root_token = int(bonus)
        state.root_hidden = hidden[-1]

    def release(self, request_id) -> None:
        state = self._states.pop(request_id, None)
        if state is not None and len(self._free_caches) < MAX_FREE_CACHES:
            self._free_caches.append(state.cache)

    # ---- drafting -----------------------------------------------------------------------------

    @torch.no_grad()
    def propose(self, request_id, depth, top_k, max_nodes) -> DraftTree:
        state = self._state(request_id)
        depth = _check_count('depth', depth, 1)
        top_k = _check_count('top_k', top_k, 1)
        max_nodes = _check_count('max_nodes', max_nodes, 2)
        vocab = self.head.lm_head.weight.shape[0]
        if top_k > vocab:
            raise ValueError(f'top_k: {top_k} exceeds the vocabulary size {vocab}')
        self._check_position(state.stable_len - 1 + depth)
        # Every level after the first forwards at most top_k frontier nodes, one slot each.
        self._ensure_slots(state, state.stable_len + (depth - 1) * top_k)
        device = state.root_hidden.device
        hidden_of = {ROOT: state.root_hidden}           # candidate id -> (H,) draft output
        slot_of: dict[int, int] = {}                    # candidate id -> scratch slot
        next_slot = state.stable_len

        def expand(partial: PartialTree, frontier: Sequence[int]):
            nonlocal next_slot
            if list(frontier) == [ROOT]:
                # Depth-1 candidates come from the last stable output: no forward needed.
                return self._proposals(state.root_hidden[None], top_k)
            num = len(frontier)
            slots = list(range(next_slot, next_slot + num))
            next_slot += num
            slot_of.update(zip(frontier, slots))
            kv_limit = next_slot
            # Tree attention: the stable prefix, the node's ancestors (below the root, whose
            # draft state is the last stable position) and the node itself.
            rows, cols = [], []
            for row, node in enumerate(frontier):
                for ancestor in partial.path_to(node)[1:]:
                    rows.append(row)
                    cols.append(slot_of[ancestor])
            mask = torch.zeros(num, kv_limit, dtype=torch.bool, device=device)
            mask[:, :state.stable_len] = True
            mask[torch.tensor(rows, device=device), torch.tensor(cols, device=device)] = True
            batch = StepBatch(
                positions=torch.tensor([state.stable_len - 1 + partial.depths[n]
                                        for n in frontier], device=device),
                slot_mapping=torch.tensor(slots, device=device),
                attn_mask=mask, kv_limit=kv_limit)
            inputs = self._embed([partial.tokens[n] for n in frontier])           # (F, H)
            parents = torch.stack([hidden_of[partial.parents[n]] for n in frontier])
            hidden = self._forward(inputs, parents, batch, state.cache)             # (F, H)
            hidden_of.update(zip(frontier, hidden))
            return self._proposals(hidden, top_k)

        return build_dynamic_tree(state.root_token, expand, depth, top_k, max_nodes)

    # ---- helpers ------------------------------------------------------------------------------

    def _forward(self, inputs, features, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        self.num_forward_passes += 1
        return self.head(inputs, features, batch, cache)

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        device = self.head.fc.weight.device
        return self.head.embed(torch.tensor(tokens, dtype=torch.long, device=device))

    def _proposals(self, hidden: torch.Tensor, top_k: int) -> list[list[tuple[int, float]]]:
        """(F, H) draft outputs -> per row the top_k (token, log-probability), best first."""
        logits = self.head.logits(hidden)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()     # log_softmax over 32k entries needs > 8 mantissa bits
        values, indices = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
        # One host transfer per level (the tree builder is plain Python). log_softmax is <= 0
        # mathematically; the clamp guards the last rounding bit.
        values = values.clamp(max=0.0).tolist()
        return [list(zip(i, v)) for i, v in zip(indices.tolist(), values)]

    def _state(self, request_id) -> _DraftState:
        if request_id not in self._states:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')
        return self._states[request_id]

    def _check_rows(self, name: str, x, rows: int | None) -> int:
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden_size:
            raise ValueError(f'{name}: expected a (rows, {self.hidden_size}) tensor, got '
                             f'{tuple(getattr(x, "shape", ()))}')
        if rows is not None and x.shape[0] != rows:
            raise ValueError(f'{name}: expected {rows} rows, got {x.shape[0]}')
        if x.shape[0] < 1:
            raise ValueError(f'{name}: needs at least one row')
        return int(x.shape[0])

    def _check_position(self, position: int) -> None:
        if position >= self.max_positions:
            raise ValueError(f'draft position {position} exceeds the draft head\'s '
                             f'max_position_embeddings {self.max_positions}')

    def _take_cache(self, num_slots: int) -> KVCache:
        for i, cache in enumerate(self._free_caches):
            if cache.num_slots >= num_slots:
                return self._free_caches.pop(i)
        return self.head.new_kv_cache(num_slots)

    def _ensure_slots(self, state: _DraftState, num_slots: int) -> None:
        """Grow a request's cache (rare: larger trees than planned); stable slots are kept."""
        if num_slots <= state.cache.num_slots:
            return
        bigger = self.head.new_kv_cache(num_slots + self.slot_margin)
        n = state.stable_len
        for old, new in zip(state.cache.k + state.cache.v, bigger.k + bigger.v):
            new[:n] = old[:n]
        state.cache = bigger


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
        self.action_dim = _check_count('action_dim', action_dim, 1)
        self.error_rate = float(error_rate)
        self.seed = int(seed)
        self.wrong_tokens = None if wrong_tokens is None else [int(t) for t in wrong_tokens]
        if self.wrong_tokens is not None and len(set(self.wrong_tokens)) < 2:
            raise ValueError('wrong_tokens: needs at least two distinct tokens')
        self._num_decided: dict[int, int] = {}
        self._roots: dict[int, int] = {}
        self.num_forward_passes = 0

    def begin(self, request_id, prefix_embeds, prefix_features, root_token) -> None:
        self._num_decided[request_id] = 1       # the prefill decided the first token
        self._roots[request_id] = int(root_token)

    def num_decided(self, request_id: int) -> int:
        return self._num_decided[request_id]

    def propose(self, request_id, depth, top_k, max_nodes) -> DraftTree:
        depth = _check_count('depth', depth, 1)
        max_nodes = _check_count('max_nodes', max_nodes, 2)
        if request_id not in self._num_decided:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')
        reference = [int(t) for t in self.tokens_for(request_id)][:self.action_dim]
        start = self._num_decided[request_id]
        count = max(0, min(depth, max_nodes - 1, len(reference) - start))
        tokens = [self._maybe_wrong(request_id, start + i, reference[start + i])
                  for i in range(count)]
        return chain_tree(self._roots[request_id], tokens)

    def advance(self, request_id, path_tokens, path_features, bonus) -> None:
        if request_id not in self._num_decided:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')
        # Accepted drafts (len(path) - 1) plus the bonus token were decided.
        self._num_decided[request_id] += len(path_tokens)
        self._roots[request_id] = int(bonus)

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


__all__ = ['Drafter', 'EagleDrafter', 'OracleDrafter']
