"""Packed steps over the unified KV ring: cross-request pipelining (ActionFlow) and speculative
verification (EAGLE-2 trees + Spec-VLA relaxed acceptance) in one strategy.

Each step is ONE verifier forward over: the prefill of the oldest waiting frame (if it can be
admitted) + one work item per in-flight request. A work item is a draft tree rooted at the
request's last decided token; plain pipelining is the degenerate tree of only the root (one
decode token), so the same code serves every mode:

    mode           max in flight          work item
    pipeline       config.max_inflight    root only (1 decode token)
    spec           1                      EAGLE-2 draft tree
    pipeline_spec  config.max_inflight    EAGLE-2 draft tree

Step (numbered as in ``step``): 1 schedule, 2 build segments (prefill embeddings, draft trees),
3 plan ring indices, 4 build the attention mask, 5 one verifier forward, 6 greedy rows,
7 prefill bookkeeping, 8 acceptance + KV compaction of the accepted path + draft update,
9 emit finished requests in per-stream order.
"""
from __future__ import annotations

import time

import torch

from ..config import EngineConfig
from ..models.layers import StepBatch
from .acceptance import accept, truncate
from .draft_tree import DraftTree, chain_tree
from .kv_ring import KVRing
from .scheduler import RequestInfo, Scheduler
from .step_plan import SegmentSpec, StepPlan, plan_step


def prepare_attention_mask(plan: StepPlan, num_slots: int, device) -> torch.Tensor:
    """(T, num_slots) bool mask implementing StepPlan's attention rule."""
    mask = torch.zeros(plan.num_tokens, num_slots, dtype=torch.bool, device=device)
    for s in range(plan.num_segments):
        r0, r1 = plan.cu_seqlens_q[s], plan.cu_seqlens_q[s + 1]
        n, h = r1 - r0, plan.history_lens[s]
        slots = torch.tensor(plan.kv_slots[s], dtype=torch.long, device=device)
        if h:
            mask[r0:r1, slots[:h]] = True
        parents = plan.tree_parents[s]
        if parents is None:
            local = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        else:
            local = torch.eye(n, dtype=torch.bool, device=device)
            for i in range(1, n):   # parents precede children: row i = own bit | parent's row
                local[i] |= local[parents[i]]
        rows = torch.arange(r0, r1, device=device)
        mask[rows[:, None], slots[h:][None, :]] = local
    return mask


class FlexAttentionBackend:
    """FlexAttention over the packed ring: a BlockMask built from the step's dense mask lets
    the kernel skip every fully masked block (other requests' slots, free ring space). On CUDA
    ``flex_attention`` is compiled once and kept on this object; on CPU it runs eagerly (used
    by the tests to check it against SDPA)."""

    def __init__(self, device):
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        self._create_block_mask = create_block_mask
        on_cuda = getattr(device, 'type', str(device)) == 'cuda'
        self.attention = torch.compile(flex_attention) if on_cuda else flex_attention
        self.device = device

    @classmethod
    def for_config(cls, config: EngineConfig, device):
        backend = config.attention_backend
        if backend == 'auto':
            backend = 'flex' if getattr(device, 'type', str(device)) == 'cuda' else 'sdpa'
        return cls(device) if backend == 'flex' else None

    def block_mask(self, dense: torch.Tensor):
        """dense (T, S) bool -> BlockMask with the same allowed (query, slot) pairs."""
        def mask_mod(b, h, q_idx, kv_idx):
            return dense[q_idx, kv_idx]
        return self._create_block_mask(mask_mod, None, None, dense.shape[0], dense.shape[1],
                                       device=self.device)


class PackedStrategy:
    def __init__(self, engine, config: EngineConfig):
        self.engine = engine
        self.runner = engine.runner
        self.config = config
        self.is_speculative = config.is_speculative
        self.drafter = engine._draft
        if self.is_speculative and self.drafter is None:
            raise ValueError(f'mode {config.mode!r} needs a draft head (draft_path)')
        max_inflight = config.max_inflight if config.is_pipelined else 1
        action_dim = self.runner.action_dim
        self.scratch = config.tree_max_nodes if self.is_speculative else 1
        max_prefix = self.runner.max_prefix_len(config.max_instruction_tokens)
        capacity = max_inflight * (max_prefix + action_dim + self.scratch)
        self.ring = KVRing(capacity)
        self.cache = self.runner.new_cache(capacity)
        self.scheduler = Scheduler(max_inflight, action_dim, self.ring)
        self.requests = {}
        self.roots: dict[int, int] = {}      # request id -> last decided token (not yet in KV)
        self.flex = FlexAttentionBackend.for_config(config, self.runner.device)

    # ---- bookkeeping passthroughs ------------------------------------------------------------

    def config_changed(self, config: EngineConfig) -> None:
        if self.is_speculative and config.tree_max_nodes > self.scratch:
            raise ValueError(f'tree_max_nodes: {config.tree_max_nodes} exceeds the ring scratch '
                             f'of {self.scratch} slots per request reserved at load time')
        self.config = config

    def submit(self, request) -> None:
        prefix_len = self.runner.prefix_len(request.input_ids)
        action_dim = self.runner.action_dim
        self.scheduler.submit(RequestInfo(request.request_id, request.frame.stream_id,
                                          prefix_len, action_dim,
                                          prefix_len + action_dim + self.scratch))
        self.requests[request.request_id] = request

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def has_waiting(self) -> bool:
        return self.scheduler.num_waiting > 0

    def drop_waiting(self, stream_id: str) -> list[int]:
        return self._forget(self.scheduler.drop_waiting(stream_id))

    def reset(self, stream_id: str | None = None) -> list[int]:
        return self._forget(self.scheduler.reset(stream_id))

    def abort_all(self) -> list:
        """Drop everything after a failed step; returns the requests to report as failed."""
        ids = self.scheduler.reset(None)
        victims = [self.requests[i] for i in ids if i in self.requests]
        self._forget(ids)
        return victims

    def _forget(self, ids: list[int]) -> list[int]:
        for i in ids:
            self.requests.pop(i, None)
            self.roots.pop(i, None)
            if self.drafter is not None:
                self.drafter.release(i)
        return ids

    # ---- one packed step ---------------------------------------------------------------------

    def _work_item(self, request_id: int) -> DraftTree:
        """Draft tree for an in-flight request (just the root when not speculating)."""
        root = self.roots[request_id]
        remaining = self.scheduler.num_remaining(request_id)
        depth = min(self.config.tree_depth, remaining - 1)
        if not self.is_speculative or depth < 1:
            return chain_tree(root, [])
        return self.drafter.propose(request_id, depth, self.config.tree_top_k,
                                    self.config.tree_max_nodes)

    @torch.no_grad()
    def step(self) -> list:
        runner, sched, cfg = self.runner, self.scheduler, self.config
        # 1. schedule
        work = sched.schedule()
        if work.is_empty:
            return []
        # 2. segments: the prefill first, then one tree per in-flight request
        segments, embeds, trees = [], [], {}
        prefill = work.prefill
        if prefill is not None:
            request = self.requests[prefill.request_id]
            request.start_time = time.perf_counter()
            prompt = runner.prepare_prompt(request.frame, cfg, request.input_ids)
            segments.append(SegmentSpec(prefill.request_id, 0, prompt.embeds.shape[0],
                                        'prefill'))
            embeds.append(prompt.embeds)
        for rid in work.decode_ids:
            tree = self._work_item(rid)
            trees[rid] = tree
            segments.append(SegmentSpec(rid, sched.history_len(rid), tree.num_nodes, 'tree',
                                        tree.parents))
            ids = torch.tensor(tree.tokens, dtype=torch.long, device=runner.device)
            embeds.append(runner.embed_tokens(ids))
        # 3-4. ring indices and mask
        plan = plan_step(self.ring, segments)
        device = runner.device
        mask = prepare_attention_mask(plan, self.ring.capacity, device)
        batch = StepBatch(
            positions=torch.tensor(plan.positions, dtype=torch.long, device=device),
            slot_mapping=torch.tensor(plan.slot_mapping, dtype=torch.long, device=device),
            attn_mask=mask, kv_limit=self.ring.capacity)
        if self.flex is not None:
            batch.block_mask = self.flex.block_mask(mask)
            batch.flex_fn = self.flex.attention
        # 5. one verifier forward for everything in flight
        hidden = runner.forward(torch.cat(embeds, dim=0), batch, self.cache)
        self.engine.num_verifier_forwards += 1
        # 6. greedy tokens only where they are needed: prefill's last row + every tree node
        seg_rows = []
        for s in range(plan.num_segments):
            r0, r1 = plan.cu_seqlens_q[s], plan.cu_seqlens_q[s + 1]
            seg_rows.append(range(r1 - 1, r1) if plan.kinds[s] == 'prefill' else range(r0, r1))
        flat = [r for rows in seg_rows for r in rows]
        argmax = runner.greedy(hidden[flat], cfg.restrict_to_action_tokens).tolist()
        offset = 0
        for s, rows in enumerate(seg_rows):
            rid = plan.request_ids[s]
            picks = argmax[offset:offset + len(rows)]
            offset += len(rows)
            request = self.requests[rid]
            request.forward_passes += 1
            if plan.kinds[s] == 'prefill':
                # 7. the prefill decides the first action token
                self._after_prefill(request, picks[0], embeds[0], hidden[:rows.stop])
            else:
                # 8. verify the tree, keep the accepted path, update the draft
                self._after_verify(request, trees[rid], picks, hidden[rows.start:rows.stop],
                                   plan.history_lens[s])
        # 9. emit in per-stream submission order
        return [self.engine.finish(self.requests.pop(i)) for i in sched.pop_finished()]

    def _after_prefill(self, request, token: int, prefix_embeds, prefix_hidden) -> None:
        rid = request.request_id
        request.tokens.append(token)
        request.accepted_lengths.append(1)
        self.roots[rid] = token
        finished = self.scheduler.on_tokens(rid, 1)
        if self.is_speculative and not finished:
            self.drafter.begin(rid, prefix_embeds, prefix_hidden, token)

    def _after_verify(self, request, tree: DraftTree, picks: list[int], tree_hidden,
                      history_len: int) -> None:
        rid = request.request_id
        at = self.runner.action_tokenizer
        acc = accept(tree, picks, relax_threshold=self.config.relax_threshold,
                     is_action_token=at.is_action_token, token_to_bin=at.token_to_bin)
        emitted = truncate(acc, self.scheduler.num_remaining(rid))
        request.tokens.extend(emitted)
        request.accepted_lengths.append(len(emitted))
        if self.scheduler.num_remaining(rid) - len(emitted) > 0:
            # Compact the accepted path's KV: node i sits at logical history_len + i; the path
            # must occupy history_len, history_len + 1, ... (gather first: overlap-safe).
            path = list(acc.path_nodes)
            moves = [(n, j) for j, n in enumerate(path) if n != j]
            if moves:
                src = self.ring.slots(rid, history_len, tree.num_nodes)
                src_t = torch.tensor([src[n] for n, _ in moves], device=self.runner.device)
                dst_t = torch.tensor([src[j] for _, j in moves], device=self.runner.device)
                self.cache.copy_slots(src_t, dst_t)
            self.roots[rid] = acc.bonus_token
            if self.is_speculative:
                self.drafter.advance(rid, [tree.tokens[n] for n in path], tree_hidden[path],
                                     acc.bonus_token)
        elif self.drafter is not None:
            self.drafter.release(rid)
        self.scheduler.on_tokens(rid, len(emitted))
