"""The EAGLE drafter: the draft head (models/draft.py) over one shared draft KV cache.

``EagleDrafter`` keeps a lane of the draft KV cache per in-flight request and grows the
EAGLE-2 dynamic trees of every in-flight request together: one batched draft forward per tree
level for all of them. The trees grow as arrays (engine/drafting/tree_growth.py), bit for bit the
trees of the plain reference builder (engine/drafting/draft_tree.py, the test oracle); each
forward's top-k comes back in one read as numpy arrays, never as per-candidate Python objects.

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

import time
from dataclasses import dataclass

import numpy as np
import torch

from ...config import EngineConfig
from ...models.layers import PLAIN, LayerKernels
from ...validation import check_int
from .draft_layout import (DRAFT_COLS_BUCKET, DRAFT_FEATURES_BUCKET, FedNodes, LaneAdvance,
                           LaneBegin, LevelMember, level_layout, level_step, update_layout)
from .draft_tree import DraftTree
from .drafter import DraftBegin, Drafter
from ..device.packed_forward import PackedForward, inference_mode
from ..device.step_inputs import next_power_of_two, power_of_two_buckets, round_up
from .tree_growth import TreeGrowth

# Proposals kept per request after each update: any tree_top_k (a run-time tunable, at most
# 32) reads a prefix of them, so changing it never needs a recomputation.
MAX_TOP_K = 32
# Draft scratch per request: (tree_depth - 1) frontier levels of at most tree_top_k nodes.
MAX_SCRATCH = (16 - 1) * MAX_TOP_K


@dataclass
class _DraftState:
    lane: int                   # the request's region of the shared draft KV cache
    stable_len: int             # draft positions 0..stable_len-1 are stable (slot == position)
    root_token: int
    # The draft's top MAX_TOP_K after the root, best first: (1, MAX_TOP_K) log-probabilities
    # (float32) and token ids (int64).
    root_proposals: tuple[np.ndarray, np.ndarray] | None


class EagleDrafter(Drafter):
    """EAGLE-2 drafting with an ``EagleDraftHead``, batched across in-flight requests.

    One draft KV cache holds ``num_lanes`` lanes (one per request in flight) of ``lane_len``
    slots plus a scratch slot; lane-relative slot p holds stable draft position p, tree nodes
    use the slots after the stable ones. Each draft forward goes through a ``PackedForward``
    (one upload, static buffers, CUDA graphs when enabled) with the verifier's segment layout:
    ``update`` is one forward for the step's prefixes (``begin``) and every accepted path; each
    tree level after the first is one forward for every request's frontier. Draft outputs at
    the roots stay on the device (``_root_hidden``, one row per lane).

    With ``pad_shapes`` (default: ``use_cuda_graphs``) every draft forward is padded to a
    shape bucket (``draft_layout.DRAFT_*_BUCKET``): a few shapes serve all requests, so each
    CUDA graph is captured on a bucket's first use and replayed afterwards. Padding rows
    write the scratch slot and the spare root row (lane ``num_lanes``) only; the trees are
    the same.
    """

    def __init__(self, runner, head, num_lanes: int = 1, max_instruction_tokens: int = 128,
                 use_cuda_graphs: bool = False, pad_shapes: bool | None = None,
                 kernels: LayerKernels = PLAIN):
        self.head = head
        self.kernels = kernels      # the draft layers' fused kernels (default: plain torch)
        self.max_tokens = int(runner.max_action_tokens)
        self.num_lanes = check_int('num_lanes', num_lanes, minimum=1)
        self.hidden_size = head.cfg.hidden_size
        self.max_positions = head.cfg.max_position_embeddings
        self.lane_len = (runner.max_prefix_len(max_instruction_tokens) + self.max_tokens + 1
                         + MAX_SCRATCH)
        self.scratch_slot = self.num_lanes * self.lane_len
        self.cache = head.new_kv_cache(self.scratch_slot + 1)
        weight = head.fc.weight
        self.pad_shapes = bool(use_cuda_graphs if pad_shapes is None else pad_shapes)
        # What a tree level's nodes read as their parents' draft outputs: one row per lane's
        # root (the spare last one takes padding rows' writes), then the previous level's rows.
        max_level_rows = next_power_of_two(self.num_lanes) * MAX_TOP_K
        self._sources = torch.zeros(self.num_lanes + 1 + max_level_rows, self.hidden_size,
                                    dtype=weight.dtype, device=weight.device)
        self._root_hidden = self._sources[:self.num_lanes + 1]
        self.max_top_k = min(MAX_TOP_K, head.lm_head.weight.shape[0])
        self.forward = PackedForward(self._step, weight.device, use_cuda_graphs)
        self._states: dict[int, _DraftState] = {}
        self._free_lanes = list(range(self.num_lanes))
        self.num_forward_passes = 0
        self.forward_s = 0.0

    @classmethod
    def for_engine(cls, runner, head, config: EngineConfig) -> 'EagleDrafter':
        # With ``use_cuda_graphs`` the draft forwards are graphed too, over padded shape
        # buckets: unpadded, their shapes changed with every prompt length, accepted path and
        # tree level, and capturing each cost 125 ms per pipelined step on the 7B shape
        # (bench/README.md). Tree-level buckets are built by ``capture_graphs``, update
        # buckets on first use.
        # The draft layers use the verifier's kernels (fused RoPE + KV write and norms with
        # ``use_kernels``, the segment attention kernel with ``attention_backend`` ring).
        return cls(runner, head, num_lanes=config.num_inflight,
                   max_instruction_tokens=config.max_instruction_tokens,
                   use_cuda_graphs=config.use_cuda_graphs,
                   kernels=runner.kernels_for(config))

    # ---- the packed draft forward ------------------------------------------------------------

    def _step(self, batch, ints: dict, dense: dict, top_k: int) -> dict:
        """One draft forward: rows -> draft features; top-k log-probabilities of ``out_rows``.

        Inputs per packed row: the token embedding (a prefill block's rows 0..L-2 are its
        prompt's embeddings e_1..e_{L-1}, its last row its root's: ``prefix_inputs`` picks
        them from the prompts' embeddings and the roots' embeddings) and a feature row
        (``features[feature_rows]``). ``out_lanes`` (update only) stores the output rows as the
        lanes' root features.
        """
        head = self.head
        x = head.embed(ints['token_ids'])
        if batch.num_prefill:
            sources = torch.cat([head.embed(ints['prefill_token']), dense['prefix_embeds']])
            x = torch.cat([sources.index_select(0, ints['prefix_inputs']), x])
        features = dense['features'].index_select(0, ints['feature_rows'])
        hidden = head(x, features, batch, self.cache, self.kernels)
        out = hidden.index_select(0, ints['out_rows'])
        if 'out_lanes' in ints:
            self._root_hidden.index_copy_(0, ints['out_lanes'], out)
        logits = head.logits(out)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()     # log_softmax over 32k entries needs > 8 mantissa bits
        values, indices = torch.log_softmax(logits, dim=-1).topk(top_k, dim=-1)
        # log_softmax is <= 0 mathematically; the clamp guards the last rounding bit. Indices
        # (< 2^24) are exact in float32: one tensor, one host read.
        return {'hidden': hidden,
                'topk': torch.stack([values.clamp(max=0.0), indices.to(values.dtype)])}

    def _run(self, step, dense: dict, top_k: int):
        """-> (log-probabilities (rows, top_k) float32, token ids (rows, top_k) int64, hidden
        states on the device)."""
        self.num_forward_passes += 1
        start = time.perf_counter()
        out = self.forward(step, dense, {'top_k': top_k})
        topk = out['topk'].cpu().numpy()               # the forward's one device -> host read
        self.forward_s += time.perf_counter() - start
        return topk[0], topk[1].astype(np.int64), out['hidden']

    # ---- lifecycle ----------------------------------------------------------------------------

    @inference_mode
    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        if not begins and not advances:
            return
        self._check_rows('features', features, None)
        lengths = [self._check_begin(begin, begins[:b]) for b, begin in enumerate(begins)]
        if len(begins) > len(self._free_lanes):
            raise RuntimeError(f'all {self.num_lanes} draft lanes are in use')
        free_lanes = list(self._free_lanes)
        new_states = []
        for begin, length in zip(begins, lengths):
            state = _DraftState(free_lanes.pop(0), length, int(begin.root_token), None)
            new_states.append((begin.request_id, state))
        advanced = []
        for adv in advances:
            state = self._state(adv.request_id)
            path = [int(t) for t in adv.path_tokens]
            if not path or path[0] != state.root_token:
                raise ValueError(f'path_tokens: must start with the current root '
                                 f'{state.root_token}, got {path[:1]}')
            if len(adv.feature_rows) != len(path):
                raise ValueError(f'path_features: expected {len(path)} rows, got '
                                 f'{len(adv.feature_rows)}')
            self._check_position(state.stable_len + len(path) - 1)
            advanced.append((state, path, int(adv.bonus)))
        layout = update_layout(
            [LaneBegin(state.lane, length, begin.feature_rows, state.root_token)
             for begin, length, (_, state) in zip(begins, lengths, new_states)],
            [LaneAdvance(state.lane, state.stable_len, path, adv.feature_rows, bonus)
             for (state, path, bonus), adv in zip(advanced, advances)],
            self.lane_len, self.scratch_slot, self.num_lanes, self.pad_shapes)
        step = layout.step
        if self.pad_shapes and features.shape[0] % DRAFT_FEATURES_BUCKET:
            features = torch.cat([features, features.new_zeros(
                -features.shape[0] % DRAFT_FEATURES_BUCKET, features.shape[1])])
        dense = {'features': features}
        if begins:
            padded_embeds = []
            for begin, padding in zip(begins, layout.prompt_padding):
                padded_embeds.append(begin.prefix_embeds)
                if padding:
                    padded_embeds.append(begin.prefix_embeds.new_zeros(padding,
                                                                       self.hidden_size))
            dense['prefix_embeds'] = torch.cat(padded_embeds) if len(padded_embeds) > 1 \
                else padded_embeds[0]
        values, tokens, _ = self._run(step, dense, self.max_top_k)
        self._free_lanes = free_lanes
        for request_id, state in new_states:
            self._states[request_id] = state
        for state, path, bonus in advanced:
            state.stable_len += len(path)
            state.root_token = bonus
        for r, state in enumerate([st for _, st in new_states] + [a[0] for a in advanced]):
            state.root_proposals = (values[r:r + 1], tokens[r:r + 1])

    def _check_begin(self, begin: DraftBegin, earlier: list) -> int:
        """A new prompt's row count, after checking it can begin a draft lane."""
        if begin.request_id in self._states or any(
                begin.request_id == e.request_id for e in earlier):
            raise ValueError(f'request_id: {begin.request_id} already has a draft state; '
                             'release it first')
        length = self._check_rows('prefix_embeds', begin.prefix_embeds, None)
        if len(begin.feature_rows) != length:
            raise ValueError(f'prefix_features: expected {length} rows, got '
                             f'{len(begin.feature_rows)}')
        self._check_position(length - 1)
        # The longest prefix: a prompt of max_prefix_len rows plus the action tokens a
        # speculative prefill decided before the root (at most max_tokens - 1).
        if length > self.lane_len - 2 - MAX_SCRATCH:
            raise ValueError(f'prefix_embeds: {length} rows exceed the draft lane')
        return length

    def release(self, request_id) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self._free_lanes.append(state.lane)

    # ---- drafting -----------------------------------------------------------------------------

    @inference_mode
    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        top_k = check_int('top_k', top_k, minimum=1)
        max_nodes = check_int('max_nodes', max_nodes, minimum=2)
        if top_k > self.max_top_k:
            raise ValueError(f'top_k: {top_k} exceeds {self.max_top_k} (the vocabulary size '
                             f'or {MAX_TOP_K})')
        if len(set(request_ids)) != len(request_ids):
            raise ValueError(f'request_ids: each request at most once, got {list(request_ids)}')
        states = [self._state(r) for r in request_ids]
        growths = []
        for state, depth in zip(states, depths):
            depth = check_int('depth', depth, minimum=1)
            self._check_position(state.stable_len - 1 + depth)
            if (depth - 1) * top_k > MAX_SCRATCH:
                raise ValueError(f'depth, top_k: {depth} x {top_k} exceed the draft scratch')
            growth = TreeGrowth(state.root_token, depth, top_k, min_prob)
            growth.expand(*state.root_proposals)    # depth 1: the root's draft output, no forward
            growths.append(growth)
        # Per request, the candidates fed so far as a tree of their own (``FedNodes``). Each
        # level feeds the newest frontiers (engine/draft_layout.level_layout); a node's
        # feature is its parent's draft output: the lane's root row, or a row of the previous
        # level's forward.
        fed = [FedNodes(g.capacity, state.root_token) for g, state in zip(growths, states)]
        num_roots = self.num_lanes + 1
        num_previous = 0        # rows of the previous level's output, after the roots
        while True:
            members = [i for i, growth in enumerate(growths) if not growth.is_done]
            if not members:
                return [growth.tree(max_nodes) for growth in growths]
            level = []
            for i in members:
                frontier = growths[i].frontier
                level.append(LevelMember(fed[i], states[i].lane, states[i].stable_len,
                                         frontier, growths[i].parents[frontier],
                                         growths[i].tokens[frontier]))
            step, num_rows = level_layout(level, num_roots, top_k, self.lane_len,
                                          self.scratch_slot, self.pad_shapes)
            # Padded: the whole sources buffer (one shape); else the roots and the rows in use.
            source = self._sources if self.pad_shapes else \
                self._sources[:num_roots + num_previous]
            values, tokens, hidden = self._run(step, {'features': source}, top_k)
            # The next level reads this level's outputs after the roots (copied now: with
            # graphs ``hidden`` is the graph's output, rewritten by its next replay).
            num_previous = hidden.shape[0]
            self._sources[num_roots:num_roots + num_previous].copy_(hidden)
            for s, i in enumerate(members):
                growth = growths[i]
                rows = slice(s * num_rows, s * num_rows + growth.frontier.size)
                fed[i].row_of[growth.frontier] = np.arange(rows.start, rows.stop)
                growth.expand(values[rows], tokens[rows])

    @inference_mode
    def capture_graphs(self, prefix_len: int, tree_depth: int, top_k: int) -> int:
        """With padded shapes: build every tree-level bucket that trees of ``tree_depth``
        levels and ``top_k`` children over a prompt of ``prefix_len`` rows can meet (1 to
        ``num_lanes`` requests, every gathered-slot bucket up to the deepest tree's), by
        padding-only forwards: their rows write the scratch slot only and nothing is read
        back into any request's state. With CUDA graphs each bucket is captured now instead
        of in the middle of serving. Update buckets follow the accepted paths and are built
        on first use. Returns the number of buckets built."""
        if not self.pad_shapes:
            return 0
        before = self.forward.num_buckets
        largest = prefix_len + self.max_tokens + (tree_depth - 1) * top_k
        for num_segments in power_of_two_buckets(self.num_lanes):
            for num_cols in range(DRAFT_COLS_BUCKET, round_up(largest, DRAFT_COLS_BUCKET) + 1,
                                  DRAFT_COLS_BUCKET):
                step = level_step([], np.zeros(num_segments * top_k, dtype=np.int64),
                                  num_segments, top_k, num_cols, self.scratch_slot)
                self.forward(step, {'features': self._sources}, {'top_k': top_k})
        return self.forward.num_buckets - before

    # ---- checks -------------------------------------------------------------------------------

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


__all__ = ['EagleDrafter']
