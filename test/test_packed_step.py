"""The packed step's pieces against plain references, on random inputs (CPU):
- the host packer (engine/device/step_inputs.py) against the plain-Python attention rule of
  engine/step_plan.py, over random ring layouts (wrap-around included) and random trees;
- segment attention against the dense-mask reference (float64);
- padding (the fixed shapes CUDA graphs replay) changes no real row;
- fused q/k/v and gate/up projections against the separate ones, and their fallbacks.
"""
import dataclasses
import random

import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.scheduling.kv_ring import KVRing
from vla_spec_ros.engine.device.runner import dense_batch
from vla_spec_ros.engine.device.step_inputs import (NO_PARENT, PrefillRows, pack_step,
                                                    padding_step, tree_rows)
from step_plan import SegmentSpec, plan_step
from vla_spec_ros.models.attention import StepBatch, attend_packed, attend_segments
from vla_spec_ros.models.layers import fuse_projections
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import reference_allowed_slots


def random_parents(rng, num_nodes):
    return [NO_PARENT] + [rng.randrange(i) for i in range(1, num_nodes)]


def random_layout(seed, capacity=97):
    """A ring with a prefill and several in-flight requests at random places (some wrap)."""
    rng = random.Random(seed)
    ring = KVRing(capacity)
    ring.allocate(99, rng.randint(1, 7))            # move the cursor: spans start anywhere
    specs = []
    for rid in range(rng.randint(1, 5)):
        history = rng.randint(1, 9)
        nodes = rng.randint(1, 6)
        if ring.allocate(rid, history + nodes + rng.randint(0, 3)) is None:
            break
        parents = random_parents(rng, nodes) if rng.random() < 0.7 else \
            [NO_PARENT] + list(range(nodes - 1))
        specs.append((rid, history, parents))
    ring.release(99)
    prefill_len = rng.randint(1, 9)
    has_prefill = ring.allocate(100, prefill_len + 2) is not None and rng.random() < 0.8
    return rng, ring, specs, prefill_len if has_prefill else 0


@pytest.mark.parametrize('seed', range(40))
def test_pack_step_follows_the_plain_attention_rule(seed):
    rng, ring, specs, prefill_len = random_layout(seed)
    cap = ring.capacity
    segments = [tree_rows(ring.span(rid).start, cap, h, parents,
                          [rng.randrange(50) for _ in parents]) for rid, h, parents in specs]
    prefills = [PrefillRows(ring.span(100).start, cap, prefill_len)] if prefill_len else []
    step = pack_step(prefills, segments, scratch_slot=cap)
    plan_segments = ([SegmentSpec(100, 0, prefill_len, 'prefill')] if prefill_len else []) + \
        [SegmentSpec(rid, h, len(p), 'tree', p) for rid, h, p in specs]
    plan = plan_step(ring, plan_segments)
    rows = list(range(prefill_len)) + [prefill_len + s * step.num_rows + j
                                       for s, (_, _, p) in enumerate(specs)
                                       for j in range(len(p))]
    assert len(rows) == plan.num_tokens
    for packed_row, plan_row in zip(rows, range(plan.num_tokens)):
        assert sorted(reference_allowed_slots(step, packed_row)) == \
            sorted(plan.allowed_slots(plan_row))
        assert step.positions[packed_row] == plan.positions[plan_row]
        assert step.slot_mapping[packed_row] == plan.slot_mapping[plan_row]
    # Every padding row writes to the scratch slot and reads exactly one column.
    real = set(rows)
    for row in range(step.positions.shape[0]):
        if row not in real:
            assert step.slot_mapping[row] == cap
            s, j = divmod(row - prefill_len, step.num_rows)
            assert step.mask[s, j].sum() == 1


def random_attention_inputs(step, capacity, seed):
    """Random float64 q, caches of ``capacity`` + 1 slots and the step's new K/V (written to
    its slots, as a layer writes them), with the step's ``StepBatch`` (GQA: 4 heads, 2 KV)."""
    gen = torch.Generator().manual_seed(seed)
    heads, kv_heads, dim = 4, 2, 8
    k_cache = torch.randn(capacity + 1, kv_heads, dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(capacity + 1, kv_heads, dim, generator=gen, dtype=torch.float64)
    total = step.positions.shape[0]
    q = torch.randn(total, heads, dim, generator=gen, dtype=torch.float64)
    k_new = torch.randn(total, kv_heads, dim, generator=gen, dtype=torch.float64)
    v_new = torch.randn(total, kv_heads, dim, generator=gen, dtype=torch.float64)
    slots = torch.from_numpy(step.slot_mapping)
    k_cache[slots], v_cache[slots] = k_new, v_new
    has_segments = step.num_segments > 0
    batch = StepBatch(positions=torch.from_numpy(step.positions), slot_mapping=slots,
                      prefill_blocks=step.prefill_blocks,
                      kv_index=torch.from_numpy(step.kv_index) if has_segments else None,
                      seg_mask=torch.from_numpy(step.mask) if has_segments else None)
    return q, k_cache, v_cache, k_new, v_new, batch


@pytest.mark.parametrize('seed', range(10))
def test_segment_attention_equals_dense_reference(seed):
    rng, ring, specs, prefill_len = random_layout(seed + 100)
    cap = ring.capacity
    segments = [tree_rows(ring.span(rid).start, cap, h, parents, [0] * len(parents))
                for rid, h, parents in specs]
    prefills = [PrefillRows(ring.span(100).start, cap, prefill_len)] if prefill_len else []
    step = pack_step(prefills, segments, scratch_slot=cap, num_cols=max(
        [s.num_cols for s in segments] + [1]) + 3)
    q, k_cache, v_cache, k_new, v_new, batch = random_attention_inputs(step, cap, seed)
    out = attend_segments(q, k_cache, v_cache, batch, k_new, v_new)
    reference = attend_packed(q, k_cache, v_cache, dense_batch(batch, cap + 1))
    real = list(range(prefill_len)) + [prefill_len + s * step.num_rows + j
                                       for s, (_, _, p) in enumerate(specs)
                                       for j in range(len(p))]
    torch.testing.assert_close(out[real], reference[real], rtol=1e-12, atol=1e-12)


def random_multi_prefill_layout(seed, capacity=131):
    """A ring with two or three fresh prompts of different lengths and a few in-flight
    requests, anywhere in the ring (some spans wrap)."""
    rng = random.Random(seed)
    ring = KVRing(capacity)
    ring.allocate(99, rng.randint(1, 60))           # move the cursor: spans start anywhere
    prompts = []
    for pid in range(100, 100 + rng.randint(2, 3)):
        length = rng.randint(1, 12)
        if ring.allocate(pid, length + rng.randint(0, 3)) is not None:
            prompts.append((pid, length))
    specs = []
    for rid in range(rng.randint(0, 3)):
        history, nodes = rng.randint(1, 9), rng.randint(1, 6)
        if ring.allocate(rid, history + nodes) is not None:
            specs.append((rid, history, random_parents(rng, nodes)))
    ring.release(99)
    return rng, ring, prompts, specs


def multi_prefill_step(seed, prefill_rows=None):
    """(ring, prompts, specs, step, the plan's row of every real packed row)."""
    rng, ring, prompts, specs = random_multi_prefill_layout(seed)
    cap = ring.capacity
    segments = [tree_rows(ring.span(rid).start, cap, h, parents, [rng.randrange(50) for _ in
                                                                  parents])
                for rid, h, parents in specs]
    prefills = [PrefillRows(ring.span(pid).start, cap, length) for pid, length in prompts]
    step = pack_step(prefills, segments, scratch_slot=cap, prefill_rows=prefill_rows)
    rows, start = [], 0
    for (_, length), block in zip(prompts, step.prefill_blocks):
        rows += range(start, start + length)
        start += block
    rows += [step.num_prefill + s * step.num_rows + j for s, (_, _, p) in enumerate(specs)
             for j in range(len(p))]
    return ring, prompts, specs, step, rows


@pytest.mark.parametrize('prefill_rows', [None, 16])
@pytest.mark.parametrize('seed', range(25))
def test_several_prefills_follow_the_plain_attention_rule(seed, prefill_rows):
    ring, prompts, specs, step, rows = multi_prefill_step(seed, prefill_rows)
    assert len(prompts) >= 2
    plan = plan_step(ring, [SegmentSpec(pid, 0, length, 'prefill') for pid, length in prompts]
                     + [SegmentSpec(rid, h, len(p), 'tree', p) for rid, h, p in specs])
    assert len(rows) == plan.num_tokens
    for packed_row, plan_row in zip(rows, range(plan.num_tokens)):
        assert sorted(reference_allowed_slots(step, packed_row)) == \
            sorted(plan.allowed_slots(plan_row))
        assert step.positions[packed_row] == plan.positions[plan_row]
        assert step.slot_mapping[packed_row] == plan.slot_mapping[plan_row]
    # Each prompt's last real row decides its first token; padding rows write the scratch.
    ends = np.cumsum((0,) + step.prefill_blocks)[:-1] + [n - 1 for _, n in prompts]
    assert step.extras['prefill_read'].tolist() == ends.tolist()
    real = set(rows)
    assert all(step.slot_mapping[r] == ring.capacity
               for r in range(step.positions.shape[0]) if r not in real)


def brute_force_attention(q, k_cache, v_cache, allowed):
    """Row by row softmax attention over the physical slots ``allowed[row]`` (GQA)."""
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.zeros_like(q)
    for row, slots in allowed.items():
        keys, values = k_cache[slots], v_cache[slots]              # (n, Hkv, D)
        for h in range(heads):
            g = h // (heads // kv_heads)
            weights = torch.softmax(keys[:, g] @ q[row, h] / q.shape[2] ** 0.5, dim=0)
            out[row, h] = weights @ values[:, g]
    return out


@pytest.mark.parametrize('prefill_rows', [None, 16])
@pytest.mark.parametrize('seed', range(8))
def test_several_prefills_attend_to_their_own_rows_only(seed, prefill_rows):
    """Segment attention (unequal blocks one call each, equal padded blocks one batched call;
    the new K/V given or read back) and the dense reference both equal a row-by-row
    attention over exactly the slots the plain rule allows."""
    ring, prompts, specs, step, rows = multi_prefill_step(seed + 200, prefill_rows)
    cap = ring.capacity
    q, k_cache, v_cache, k_new, v_new, batch = random_attention_inputs(step, cap, seed)
    expected = brute_force_attention(q, k_cache, v_cache, {
        r: reference_allowed_slots(step, r) for r in rows})[rows]
    for out in (attend_segments(q, k_cache, v_cache, batch, k_new, v_new),
                attend_segments(q, k_cache, v_cache, batch),
                attend_packed(q, k_cache, v_cache, dense_batch(batch, cap + 1))):
        torch.testing.assert_close(out[rows], expected, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('packed') / 'tiny', seed=9)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


def verifier_with_random_kv(runner, capacity: int, seed: int):
    """A float64 ring runner whose whole KV cache holds seeded random values (a history every
    call with the same seed shares)."""
    verifier = runner.new_ring(capacity, EngineConfig(dtype='float64'))
    gen = torch.Generator().manual_seed(seed)
    for k, v in zip(verifier.cache.k, verifier.cache.v):
        k.copy_(torch.randn(k.shape, generator=gen, dtype=k.dtype))
        v.copy_(torch.randn(v.shape, generator=gen, dtype=v.dtype))
    return verifier


def test_padding_changes_no_real_row(policy):
    """The padded shapes graphs replay (more segments, rows, slots, prompt rows, moves) give
    the same tokens and hidden states on every real row as the tight shapes."""
    runner = policy.engine.runner
    ring = KVRing(300)
    ring.allocate(0, 40)
    ring.allocate(1, 40)
    ring.allocate(2, 60)
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.standard_normal((23, runner.cfg.llm.hidden_size)))
    segments = [tree_rows(ring.span(0).start, 300, 20, [NO_PARENT, 0, 0, 1], [5, 6, 7, 8]),
                tree_rows(ring.span(1).start, 300, 31, [NO_PARENT], [9])]
    prefill = PrefillRows(ring.span(2).start, 300, 23)
    results = []
    for padded in (False, True):
        # Identical history in both caches (random KV), then one step.
        verifier = verifier_with_random_kv(runner, 300, seed=1)
        sizes = dict(num_segments=4, num_rows=8, num_cols=96, prefill_rows=64,
                     moves=[(5, 6)], num_moves=8) if padded else dict(moves=[(5, 6)])
        step = pack_step([prefill], segments, verifier.scratch_slot, **sizes)
        tokens, hidden = verifier.run(step, [prompt])
        q = step.num_rows
        rows = list(range(23)) + [step.num_prefill + j for j in range(4)] + \
            [step.num_prefill + q]
        token_rows = [0] + [1 + j for j in range(4)] + [1 + q]
        results.append(([tokens[i] for i in token_rows], hidden[rows]))
    assert results[0][0] == results[1][0]
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-10, atol=1e-10)


def test_padding_changes_no_real_row_with_two_prompts(policy):
    """Two prompts of different lengths in one step, tight and padded to 64 rows each: each
    prompt's first token and hidden rows are the same."""
    runner = policy.engine.runner
    ring = KVRing(300)
    ring.allocate(0, 40)
    ring.allocate(1, 30)
    ring.allocate(2, 60)
    rng = np.random.default_rng(3)
    hidden_size = runner.cfg.llm.hidden_size
    prompts = [torch.from_numpy(rng.standard_normal((n, hidden_size))) for n in (23, 17)]
    prefills = [PrefillRows(ring.span(2).start, 300, 23),
                PrefillRows(ring.span(1).start, 300, 17)]
    segments = [tree_rows(ring.span(0).start, 300, 20, [NO_PARENT, 0, 0, 1], [5, 6, 7, 8])]
    results = []
    for padded in (False, True):
        verifier = verifier_with_random_kv(runner, 300, seed=1)
        sizes = dict(num_segments=2, num_rows=8, num_cols=96, prefill_rows=64) if padded \
            else {}
        step = pack_step(prefills, segments, verifier.scratch_slot, **sizes)
        tokens, hidden = verifier.run(step, prompts)
        second = step.prefill_blocks[0]
        rows = list(range(23)) + list(range(second, second + 17)) + \
            [step.num_prefill + j for j in range(4)]
        results.append((tokens[:2] + tokens[2:6], hidden[rows]))
    assert results[0][0] == results[1][0]
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-10, atol=1e-10)


def test_padding_steps_touch_no_request_kv(policy):
    """The padding-only steps that build graph buckets write the scratch slot only."""
    runner = policy.engine.runner
    verifier = verifier_with_random_kv(runner, 200, seed=2)
    before = [k[:200].clone() for k in verifier.cache.k + verifier.cache.v]
    for sizes in (((64,), 0, 1, 128, 0), ((), 4, 8, 128, 12), ((64,), 2, 1, 256, 0),
                  ((64, 64), 2, 1, 128, 0)):
        verifier.run(padding_step(*sizes, verifier.scratch_slot),
                     [torch.zeros(n, runner.cfg.llm.hidden_size, dtype=torch.float64)
                      for n in sizes[0]])
    for old, new in zip(before, verifier.cache.k + verifier.cache.v):
        assert torch.equal(old, new[:200])


def test_fused_projections_equal_separate_and_fall_back(policy):
    runner = policy.engine.runner
    lm = runner.lm
    x = torch.randn(5, lm.cfg.hidden_size, dtype=torch.float64)
    layer = lm.model.layers[0]
    with torch.no_grad():
        separate = (layer.self_attn.q_proj(x), layer.mlp.gate_proj(x), layer.mlp(x))
        fuse_projections(lm)
        try:
            fused_q = layer.self_attn.fused(x)[0]
            torch.testing.assert_close(fused_q, separate[0], rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(layer.mlp(x), separate[2], rtol=1e-12, atol=1e-12)
            # Weights are views of the fused matrix: in-place updates reach both.
            layer.mlp.gate_proj.weight.mul_(2.0)
            torch.testing.assert_close(layer.mlp.fused(x)[0], 2.0 * separate[1],
                                       rtol=1e-12, atol=1e-12)
            layer.mlp.gate_proj.weight.mul_(0.5)
            # A replaced weight is detected: the separate linears run.
            original = layer.mlp.gate_proj.weight
            layer.mlp.gate_proj.weight = torch.nn.Parameter(original.detach().clone())
            assert layer.mlp.fused(x) is None
            layer.mlp.gate_proj.weight = original
        finally:
            for sub in lm.modules():
                if hasattr(sub, 'fused'):
                    sub.fused = None
    with torch.enable_grad():
        fuse_projections(lm)
        assert layer.self_attn.fused(x) is None     # training: never the fused copy
        for sub in lm.modules():
            if hasattr(sub, 'fused'):
                sub.fused = None


def test_rope_rows_equal_apply_rope_bit_for_bit():
    from vla_spec_ros.config import LlamaConfig
    from vla_spec_ros.models.rope import RopeRows, RopeTables, apply_rope, rope_tables
    gen = torch.Generator().manual_seed(3)
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        tables = rope_tables(16, 64, 10000.0, dtype)
        positions = torch.randint(0, 64, (9,), generator=gen)
        x = torch.randn(9, 3, 16, generator=gen).to(dtype)
        rows = RopeRows.gather(tables, positions)
        expected = apply_rope(x, tables[0][positions], tables[1][positions])
        assert torch.equal(rows.apply(x), expected), dtype
        # The models' tables carry the combined (cos | signed sin) table: the same rows.
        kept = RopeTables(LlamaConfig(hidden_size=48, num_layers=1, num_heads=3,
                                      intermediate_size=32, vocab_size=8,
                                      max_position_embeddings=64)).get(dtype, 'cpu')
        assert torch.equal(kept[0], tables[0]) and torch.equal(kept[1], tables[1])
        assert torch.equal(RopeRows.gather(kept, positions).apply(x), expected), dtype


@pytest.mark.parametrize('with_prefix', [False, True])
@pytest.mark.parametrize('prefill_rows', [None, 16])
@pytest.mark.parametrize('seed', range(6))
def test_biases_made_once_per_forward_change_no_bit(seed, prefill_rows, with_prefix):
    """``StepBatch.with_biases`` (the masks as additive biases, made once per forward instead
    of by SDPA in every layer) gives bit for bit what the boolean masks give, padding rows
    that may read nothing included (zeros either way), in float64 and bfloat16, with and
    without a bidirectional prefix, over unequal prefill blocks (one call each) and equal
    padded ones (``prefill_rows`` 16: one batched call)."""
    ring, prompts, specs, step, rows = multi_prefill_step(seed + 300, prefill_rows)
    q, k_cache, v_cache, k_new, v_new, batch = random_attention_inputs(
        step, ring.capacity, seed)
    assert (len(set(step.prefill_blocks)) == 1) == (prefill_rows is not None)
    if with_prefix:
        batch = dataclasses.replace(batch, prefill_prefix=torch.tensor(
            [length // 2 for _, length in prompts]))
    if batch.seg_mask is not None:      # a row that may read nothing (no layout makes one)
        mask = batch.seg_mask.clone()
        mask[0, -1] = False
        batch = dataclasses.replace(batch, seg_mask=mask)
    for dtype in (torch.float64, torch.bfloat16):
        args = [t.to(dtype) for t in (q, k_cache, v_cache, k_new, v_new)]
        plain = attend_segments(*args[:3], batch, *args[3:])
        biased = batch.with_biases(dtype)
        assert (biased.seg_bias is None) == (batch.seg_mask is None)
        assert (biased.prefill_bias is not None) == with_prefix
        assert not plain.isnan().any()
        assert torch.equal(attend_segments(*args[:3], biased, *args[3:]), plain)
