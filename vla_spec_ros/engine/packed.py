"""The decoding strategy of every mode: one packed verifier forward per step over the unified
KV ring. AR, cross-request pipelining (ActionFlow) and speculative verification (EAGLE-2 trees
+ Spec-VLA relaxed acceptance) are configurations of this one class:

    mode           max in flight          work item of an in-flight request
    ar             1                      root only (1 decode token)
    pipeline       config.max_inflight    root only (1 decode token)
    spec           1                      EAGLE-2 draft tree
    pipeline_spec  config.max_inflight    EAGLE-2 draft tree

A step (numbered as in ``step``): 1 schedule, 2 prompt embeddings of the admitted frames
(usually one; several with ``max_prefills_per_step`` when several streams wait), queued first
so that on a GPU the vision towers run while the host plans (in the speculative modes the
first draft level's read waits for them, the GPU work being serial on one stream either way),
3 draft trees for every in-flight request (one batched draft forward per tree level), 4 host
plan (engine/device/step_inputs.py: positions, slots, per-segment KV spans and masks, last step's
KV compaction), 5 ONE verifier forward (one upload, one read of the greedy tokens), 6 prefill
bookkeeping, 7 acceptance of every tree and the compaction it implies, 8 one batched draft update
for the new prefixes and every accepted path, 9 finished requests in per-stream order.

Speculative prefill (``speculative_prefill``, spec modes, a drafter whose draft needs no
verifier features: the previous action): an admitted frame's prefill block carries its
stream's draft after the prompt, as causal rows of the same block. The prompt's last row and
every chain row are read back: the chain is accepted like any chain tree (S3 / S4), its KV is
already contiguous after the prompt (no compaction; rejected rows are overwritten later), and a
frame whose action repeats is decided by the one forward that prefills it.

The strategy returns finished requests; the engine turns them into actions. It never reaches
back into the engine.
"""
from __future__ import annotations

import time

import torch

from ..config import EngineConfig
from .drafting.acceptance import accept, truncate
from .drafting.draft_tree import DraftTree, chain_tree
from .drafting.drafter import DraftAdvance, DraftBegin
from .scheduling.kv_ring import KVRing
from .scheduling.request import Request
from .scheduling.scheduler import Scheduler
from .scheduling.step_stats import StepStats
from .device.step_inputs import (PrefillRows, next_power_of_two, pack_step, padding_step,
                                 power_of_two_buckets, round_up, tree_rows)


# CUDA-graph shape buckets (see ``_graph_sizes``): prompt rows and gathered KV slots.
PROMPT_ROWS_BUCKET = 64
KV_COLS_BUCKET = 128


def _check_relaxation(config: EngineConfig, codec) -> None:
    """Relaxed acceptance (S4) compares the codec's bins; a codec that defines no distance
    between its tokens (``supports_relaxed_acceptance`` False) refuses ``relax_threshold`` > 0
    when the engine is configured, before any frame."""
    if config.relax_threshold > 0 and not getattr(codec, 'supports_relaxed_acceptance', True):
        raise ValueError(f'relax_threshold: {config.relax_threshold} bins, but the codec '
                         f'{type(codec).__name__} defines no distance between its tokens '
                         '(supports_relaxed_acceptance is False); use 0 (exact acceptance)')


class PackedStrategy:
    def __init__(self, runner, config: EngineConfig, drafter=None):
        if config.use_cuda_graphs != runner.use_cuda_graphs:
            raise ValueError(f'use_cuda_graphs: the engine asks for {config.use_cuda_graphs} but '
                             f'its model runner was loaded with {runner.use_cuda_graphs}')
        self.runner = runner
        _check_relaxation(config, runner.codec)
        self.config = config
        self.is_speculative = config.is_speculative
        self.drafter = drafter
        # Called with each request as it starts (before its prefill is planned), when set:
        # the engine decides there what a frame's output must begin with (Request.forced).
        self.on_admit = None
        if self.is_speculative and drafter is None:
            raise ValueError(f'mode {config.mode!r} needs a draft head (draft_path)')
        # A drafter that reads no verifier features (the previous action) is handed no prefix
        # embeddings: embedding the accepted chain tokens and concatenating them to the prompt
        # would be device work that nobody reads.
        self.drafter_needs_features = drafter is not None and drafter.needs_features
        self.max_inflight = config.num_inflight
        self.max_prefills = config.num_prefills_per_step
        # The longest chain one verifier forward checks: the codec's max_draft_chain for long
        # outputs (a reasoning policy's: a verified row is not free), else the whole output.
        max_tokens = runner.max_action_tokens
        self.max_chain = min(runner.codec.max_draft_chain or max_tokens, max_tokens)
        # Speculative prefill: the longest chain a prefill block carries (0 = off). The last
        # token comes from the last chain row, so max_action_tokens - 1 drafts decide it all.
        # After a verification that accepted none of its draft, the next one verifies at most
        # this many draft tokens (the codec's draft_after_miss; None: no cap).
        self.draft_after_miss = runner.codec.draft_after_miss
        self.max_prefill_draft = min(max_tokens - 1, self.max_chain) if (
            self.is_speculative and config.speculative_prefill
            and drafter is not None and drafter.has_prefill_draft) else 0
        # Ring scratch per request: a verified tree writes all its nodes before compaction. The
        # previous action's chain (derived depth) has at most max_action_tokens nodes, root
        # included (fewer if tree_max_nodes says so): ring and graph buckets are sized for it.
        self.derives_depth = self.is_speculative and drafter.derives_depth
        if not self.is_speculative:
            self.scratch = 1
        elif self.derives_depth:
            self.scratch = min(max_tokens, self.max_chain + 1)
        else:
            self.scratch = config.tree_max_nodes
        max_prefix = runner.max_prefix_len(config.max_instruction_tokens)
        capacity = self.max_inflight * (max_prefix + runner.max_action_tokens + self.scratch)
        self.ring = KVRing(capacity)
        self.verifier = runner.new_ring(capacity, config)
        self.scheduler = Scheduler(self.max_inflight, runner.max_action_tokens, self.ring,
                                   self.max_prefills, config.stream_inflight_limit)
        self.num_verifier_forwards = 0
        self.stats = StepStats()
        self._captured_prompt_buckets: set[int] = set()     # CUDA graphs: prompt rows built

    # ---- requests ----------------------------------------------------------------------------

    def check_config(self, config: EngineConfig) -> None:
        """ValueError when run-time tunables ``config`` cannot run on this load."""
        _check_relaxation(config, self.runner.codec)
        if self.is_speculative and not self.derives_depth \
                and config.tree_max_nodes > self.scratch:
            raise ValueError(f'tree_max_nodes: {config.tree_max_nodes} exceeds the ring scratch '
                             f'of {self.scratch} slots per request reserved at load time')

    def config_changed(self, config: EngineConfig) -> None:
        self.check_config(config)
        self.config = config

    def submit(self, request: Request) -> None:
        self.scheduler.submit(request)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def has_waiting(self) -> bool:
        return self.scheduler.num_waiting > 0

    def slots_for(self, prefix_len: int) -> int:
        """Ring slots a request with a prompt of ``prefix_len`` rows holds while in flight:
        its prompt, its tokens and the tree scratch of its verifications."""
        return prefix_len + self.runner.max_action_tokens + self.scratch

    @property
    def active_streams(self) -> tuple[str, ...]:
        return self.scheduler.active_streams

    @property
    def waiting_streams(self) -> frozenset:
        return self.scheduler.waiting_streams

    @property
    def num_inflight(self) -> int:
        return self.scheduler.num_inflight

    def drop_waiting(self, stream_id: str) -> list[Request]:
        return self._released(self.scheduler.drop_waiting(stream_id))

    def replace_waiting(self, request: Request) -> list[Request]:
        return self._released(self.scheduler.replace_waiting(request))

    def reset(self, stream_id: str | None = None) -> list[Request]:
        if self.drafter is not None:
            self.drafter.forget_stream(stream_id)
        return self._released(self.scheduler.reset(stream_id))

    def abort_all(self) -> list[Request]:
        """Drop everything after a failed step; returns the requests to report as failed."""
        return self.reset(None)

    def _released(self, requests: list[Request]) -> list[Request]:
        for request in requests:
            request.pending_moves = []
            if self.drafter is not None:
                self.drafter.release(request.request_id)
        return requests

    # ---- one packed step ---------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Request]:
        """One packed step, numbered as in the module docstring; returns the requests that
        leave (in per-stream submission order)."""
        start = time.perf_counter()
        stats = self.stats
        draft_forward_before = self.drafter.forward_s if self.drafter is not None else 0.0
        # 1. schedule
        work = self.scheduler.schedule()
        if work.is_empty:
            return []
        self._build_new_prompt_graphs(work.prefills)
        # 2. the admitted frames' prompts, queued first (the towers run while the host plans)
        prefills, prefill_embeds = self._start_prefills(work.prefills)
        # 3. draft trees (just the root when not speculating or one token remains)
        t0 = time.perf_counter()
        trees = self._draft_trees(work.decode)
        stats.draft_s += time.perf_counter() - t0
        # 4. host plan: the prefill blocks, one segment per in-flight request, last step's
        #    KV compaction
        host = self._plan(prefills, work.decode, trees)
        # 5. one verifier forward for everything in flight
        t0 = time.perf_counter()
        tokens, hidden = self.verifier.run(host, prefill_embeds)
        stats.verifier_s += time.perf_counter() - t0
        self.num_verifier_forwards += 1
        # 6. each prefill decides its request's first action token(s)
        begins = self._finish_prefills(work.prefills, prefills, prefill_embeds, host, tokens)
        # 7. verify every tree, keep its accepted path
        advances = self._verify_trees(work.decode, trees, host, tokens,
                                      first_row=len(work.prefills) * host.reads_per_prefill)
        # 8. one batched draft update: the new prefixes and every accepted path
        if begins or advances:
            t0 = time.perf_counter()
            self.drafter.update(begins, advances, hidden)
            stats.draft_s += time.perf_counter() - t0
        # 9. emit in per-stream submission order
        finished = self.scheduler.pop_finished()
        if self.drafter is not None:
            stats.draft_forward_s += self.drafter.forward_s - draft_forward_before
        stats.num_steps += 1
        stats.num_advanced += len(work.prefills) + len(work.decode)
        stats.total_s += time.perf_counter() - start
        return finished

    def _build_new_prompt_graphs(self, admitted: list[Request]) -> None:
        """Step 1, with CUDA graphs: a prompt length never seen before first builds every step
        shape it can meet, so that no capture lands in the middle of serving it."""
        if not self.runner.use_cuda_graphs:
            return
        for request in admitted:
            if round_up(request.prefix_len, PROMPT_ROWS_BUCKET) \
                    not in self._captured_prompt_buckets:
                self.capture_graphs(request.prefix_len)

    def _start_prefills(self, admitted: list[Request]
                        ) -> tuple[list[PrefillRows], list[torch.Tensor]]:
        """Step 2: the admitted frames' prefill rows and their prompt embeddings (upload,
        preprocessing, vision towers, projector), queued first: on a GPU the towers run while
        the host plans. A frame keeps the tunables in force now until its action is decided;
        with speculative prefill its stream's draft rides after the prompt."""
        if not admitted:
            return [], []
        t0 = time.perf_counter()
        cfg, runner, rows = self.config, self.runner, []
        for request in admitted:
            request.tunables = cfg
            request.start_time = t0
            if self.on_admit is not None:       # the engine's (a reasoning reused, forced)
                self.on_admit(request)
            chain = self.drafter.prefill_draft(request.stream_id, self.max_prefill_draft,
                                               request.control_step) \
                if self.max_prefill_draft else ()
            rows.append(PrefillRows(self.ring.span(request.request_id).start,
                                    self.ring.capacity, request.prefix_len, tuple(chain),
                                    runner.num_bidirectional(request.prefix_len)))
        embeds = [prompt.embeds for prompt in runner.prepare_prompts(
            [r.frame for r in admitted], cfg, [r.input_ids for r in admitted])]
        self.stats.vision_s += time.perf_counter() - t0
        return rows, embeds

    def _plan(self, prefills: list[PrefillRows], decode: list[Request],
              trees: dict[int, DraftTree]):
        """Step 4: the host plan (engine/device/step_inputs.py) of the prefill blocks and one
        segment per in-flight request, with the KV compaction last step's acceptance left."""
        capacity = self.ring.capacity
        segments, moves = [], []
        for request in decode:
            tree = trees[request.request_id]
            span = self.ring.span(request.request_id)
            if request.history_len + tree.num_nodes > span.length:     # never: scratch sizing
                raise RuntimeError(f'request {request.request_id}: a tree of {tree.num_nodes} '
                                   f'nodes overflows its {span.length} ring slots')
            segments.append(tree_rows(span.start, capacity, request.history_len, tree.parents,
                                      tree.tokens))
            moves += request.pending_moves
            request.pending_moves = []
        return pack_step(prefills, segments, self.verifier.scratch_slot, moves=moves,
                         **self._padded_sizes(prefills, segments, len(moves)))

    def _finish_prefills(self, admitted: list[Request], prefills: list[PrefillRows],
                         prefill_embeds: list[torch.Tensor], host, tokens) -> list[DraftBegin]:
        """Step 6: each prefill decides its request's first action token (and, with
        speculative prefill, verifies the chain it carried: the accepted tokens' KV already
        follows the prompt, so the request continues from there). Returns the drafter's new
        prefixes."""
        begins = []
        block_start, reads = 0, host.reads_per_prefill
        for p, (request, rows, block) in enumerate(zip(admitted, prefills,
                                                       host.prefill_blocks)):
            emitted = self._after_prefill(request, rows.chain,
                                          tokens[p * reads:p * reads + rows.num_read])
            is_done = self.scheduler.on_tokens(request.request_id, list(emitted),
                                               self.runner.codec.is_complete(emitted))
            if is_done:
                self._decided(request)
            if self.is_speculative and not is_done:
                # The drafter's prefix: the prompt, then the accepted chain tokens.
                num_prefix = request.prefix_len + len(emitted) - 1
                embeds = self._prefix_embeds(prefill_embeds[p], emitted[:-1]) \
                    if self.drafter_needs_features else None
                begins.append(DraftBegin(
                    request.request_id, embeds,
                    range(block_start, block_start + num_prefix), emitted[-1],
                    request.stream_id, tuple(emitted[:-1]), request.control_step))
            block_start += block
        return begins

    def _verify_trees(self, decode: list[Request], trees: dict[int, DraftTree], host, tokens,
                      first_row: int) -> list[DraftAdvance]:
        """Step 7: acceptance of every in-flight request's tree (its greedy tokens start at
        ``first_row`` of the read-back, one segment of ``host.num_rows`` after another).
        Returns the drafter's accepted paths."""
        advances = []
        num_rows = host.num_rows
        for s, request in enumerate(decode):
            tree = trees[request.request_id]
            first = first_row + s * num_rows
            advance = self._after_verify(request, tree, tokens[first:first + tree.num_nodes],
                                         hidden_row=host.num_prefill + s * num_rows)
            if advance is not None:
                advances.append(advance)
        return advances

    def _after_prefill(self, request: Request, chain: tuple[int, ...],
                       picks: list[int]) -> tuple[int, ...]:
        """The tokens a prefill decides: its prompt's greedy token alone, or, with a drafted
        chain, the chain's accepted tokens and the verifier's token after them (acceptance
        S3 / S4 over the chain as a tree rooted at the prompt's last row)."""
        request.forward_passes += 1
        codec = self.runner.codec
        if not chain:
            emitted = (request.forced[0] if request.forced else int(picks[0]),)
        else:
            acc = accept(chain_tree(request.input_ids[-1], chain), picks,
                         relax_threshold=request.tunables.relax_threshold,
                         is_action_token=codec.is_action_token, token_to_bin=codec.token_to_bin,
                         action_marker=codec.action_marker, forced=request.forced)
            emitted = codec.cut((), truncate(acc, request.num_remaining))
            request.prefill_accepted = min(acc.num_accepted, len(emitted))
        request.accepted_lengths.append(len(emitted))
        return emitted

    def _prefix_embeds(self, prompt: torch.Tensor, accepted: tuple[int, ...]) -> torch.Tensor:
        """The drafter's prefix embeddings (L + m, H): the prompt's, then the accepted chain
        tokens' (read after the step's one sync, so this copy waits for nothing)."""
        if not accepted:
            return prompt
        ids = torch.tensor(accepted, dtype=torch.long, device=prompt.device)
        return torch.cat([prompt, self.runner.embed_tokens(ids).to(prompt.dtype)])

    def capture_graphs(self, prefix_len: int) -> int:
        """Build every verifier shape bucket a request of ``prefix_len`` prompt tokens can
        meet, and the drafter's tree-level buckets (CUDA graphs: captured now, not in the
        middle of serving). Runs padding-only steps, which touch no request's KV. Returns the
        number of buckets built."""
        if not self.runner.use_cuda_graphs:
            return 0
        self._captured_prompt_buckets.add(round_up(prefix_len, PROMPT_ROWS_BUCKET))
        largest = prefix_len + self.runner.max_action_tokens + self.scratch
        before = self.verifier.forward.num_buckets
        segment_counts = [0] + power_of_two_buckets(max(self.max_inflight - 1, 1))
        prompt_rows = round_up(prefix_len + self.max_prefill_draft, PROMPT_ROWS_BUCKET)
        for num_prefills in range(self.max_prefills + 1):
            for num_segments in segment_counts:
                if not num_prefills and not num_segments:
                    continue
                for num_cols in range(KV_COLS_BUCKET, round_up(largest, KV_COLS_BUCKET) + 1,
                                      KV_COLS_BUCKET):
                    sizes = self._graph_sizes([prefix_len] * num_prefills, num_segments, 1,
                                              num_cols, 0)
                    step = padding_step((prompt_rows,) * num_prefills, sizes['num_segments'],
                                        sizes['num_rows'], sizes['num_cols'],
                                        sizes['num_moves'], self.verifier.scratch_slot,
                                        sizes['chain_per_prefill'],
                                        has_prefix=self.runner.num_bidirectional(1) > 0)
                    embeds = [self.verifier.cache.k[0].new_zeros(
                        prompt_rows, self.runner.hidden_size)] * num_prefills
                    self.verifier.run(step, embeds)
        built = self.verifier.forward.num_buckets - before
        if self.drafter is not None:
            cfg = self.config
            built += self.drafter.capture_graphs(prefix_len, cfg.tree_depth, cfg.tree_top_k)
        return built

    def _draft_trees(self, decode: list[Request]) -> dict[int, DraftTree]:
        """One tree per in-flight request, with the tree settings it was admitted under (a
        request whose last draft missed: at most the codec's draft_after_miss tokens);
        requests sharing (top_k, max_nodes, min_prob) are drafted together."""
        trees = {}
        groups: dict[tuple[int, int, float], tuple[list[int], list[int]]] = {}
        for request in decode:
            cfg = request.tunables
            # The previous action's chain is as long as the stream knows (derives_depth).
            depth = min(request.num_remaining - 1, self.max_chain) if self.derives_depth \
                else min(cfg.tree_depth, request.num_remaining - 1)
            max_nodes = cfg.tree_max_nodes
            if request.draft_missed and self.draft_after_miss is not None:
                depth = min(depth, self.draft_after_miss)
                max_nodes = min(max_nodes, self.draft_after_miss + 1)
            if self.is_speculative and depth >= 1:
                ids, depths = groups.setdefault(
                    (cfg.tree_top_k, max_nodes, cfg.tree_min_prob), ([], []))
                ids.append(request.request_id)
                depths.append(depth)
            else:
                trees[request.request_id] = chain_tree(request.tokens[-1], [])
        for (top_k, max_nodes, min_prob), (ids, depths) in groups.items():
            trees.update(zip(ids, self.drafter.propose_batch(ids, depths, top_k, max_nodes,
                                                             min_prob)))
        return trees

    def _padded_sizes(self, prefills, segments, num_moves: int) -> dict:
        """Padded shapes of the step: tight in eager mode, graph buckets with CUDA graphs."""
        num_rows = max((s.num_rows for s in segments), default=1)
        num_cols = max((s.num_cols for s in segments), default=1)
        if not self.runner.use_cuda_graphs:
            return dict(num_segments=len(segments), num_rows=num_rows,
                        num_cols=round_up(num_cols, 16), num_moves=num_moves)
        return self._graph_sizes([p.prompt_len for p in prefills], len(segments), num_rows,
                                 num_cols, num_moves)

    def _graph_sizes(self, prefix_lens: list[int], num_segments: int, num_rows: int,
                     num_cols: int, num_moves: int) -> dict:
        """CUDA-graph buckets, few so that each is captured once and reused: every prompt of
        the step padded to the longest one's multiple of 64 rows, segment counts to powers of
        two, rows to a power of two (in the speculative modes every tree to the largest
        configured tree), gathered KV to a multiple of 128 slots, compaction moves to their
        most for the segment count; with speculative prefill every block has room for the
        longest chain and reads its rows back."""
        num_segments = next_power_of_two(num_segments) if num_segments else 0
        if self.is_speculative:
            num_rows = max(num_rows, self.scratch)
            num_moves = max(num_moves, num_segments * self.config.tree_depth)
        return dict(num_segments=num_segments, num_rows=next_power_of_two(num_rows),
                    num_cols=round_up(num_cols, KV_COLS_BUCKET), num_moves=num_moves,
                    prefill_rows=round_up(max(prefix_lens) + self.max_prefill_draft,
                                          PROMPT_ROWS_BUCKET) if prefix_lens else None,
                    chain_per_prefill=self.max_prefill_draft)

    def _after_verify(self, request: Request, tree: DraftTree, picks: list[int],
                      hidden_row: int) -> DraftAdvance | None:
        """Acceptance (S3/S4) of one tree; records tokens; returns the draft update, if any."""
        codec = self.runner.codec
        acc = accept(tree, picks, relax_threshold=request.tunables.relax_threshold,
                     is_action_token=codec.is_action_token, token_to_bin=codec.token_to_bin,
                     action_marker=codec.action_marker, decided=request.tokens,
                     forced=request.forced[len(request.tokens):])
        emitted = codec.cut(request.tokens, truncate(acc, request.num_remaining))
        is_final = codec.is_complete(request.tokens + list(emitted))
        request.forward_passes += 1
        request.accepted_lengths.append(len(emitted))
        if tree.num_nodes > 1:          # a forward without a draft says nothing of the draft
            request.draft_missed = len(acc.path_nodes) == 1
        advance = None
        if not is_final:
            # Compact the accepted path's KV: node i sits at logical history_len + i; the path
            # must occupy history_len, history_len + 1, ... The copy runs at the start of every
            # layer of the next verifier forward (gathered first: overlap-safe).
            path = acc.path_nodes
            span = self.ring.span(request.request_id)
            h = request.history_len
            request.pending_moves = [(span.slot(h + n), span.slot(h + j))
                                     for j, n in enumerate(path) if n != j]
            if self.is_speculative:
                advance = DraftAdvance(request.request_id, [tree.tokens[n] for n in path],
                                       [hidden_row + n for n in path], acc.bonus_token)
        elif self.drafter is not None:
            self.drafter.release(request.request_id)
        if self.scheduler.on_tokens(request.request_id, list(emitted), is_final):
            self._decided(request)
        return advance

    def _decided(self, request: Request) -> None:
        """A request's whole action is decided: the drafter sees it now, not when it is
        emitted (an action may wait there for an earlier frame of its stream)."""
        if self.drafter is not None:
            self.drafter.observe_action(request.stream_id, request.tokens, request.request_id,
                                        request.control_step)
