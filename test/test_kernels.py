"""Kernels vs their references, the references vs independent oracles, and wrapper validation.

Layers: (1) ``ring_shift_slots`` against a plain-list ring simulation (no torch); (2) each torch
reference against an independent computation (RoPE as a complex-number rotation, kv_copy as a
Python loop over an untouched copy); (3) each Triton kernel against its reference on random
shapes under ``TRITON_INTERPRET=1`` (CPU) and, when present, on CUDA with bf16 tolerance;
(4) the wrappers' ValueErrors. Kernels are jitted at launch time, so the ``interpret`` fixture
turns the interpreter on for one test only (monkeypatch.setenv) regardless of import order.
"""
import random

import pytest
import torch

try:
    from kernels import _triton_util
    from kernels.kv_copy import kv_copy, kv_copy_ref, kv_copy_triton, ring_shift_slots
    from kernels.rope_kv_write import rope_kv_write, rope_kv_write_ref, rope_kv_write_triton
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels import _triton_util
    from vla_spec_ros.kernels.kv_copy import (kv_copy, kv_copy_ref, kv_copy_triton,
                                              ring_shift_slots)
    from vla_spec_ros.kernels.rope_kv_write import (rope_kv_write, rope_kv_write_ref,
                                                    rope_kv_write_triton)

needs_triton = pytest.mark.skipif(not _triton_util.HAS_TRITON, reason='triton is not importable')
needs_cuda = pytest.mark.skipif(not (_triton_util.HAS_TRITON and torch.cuda.is_available()),
                                reason='needs triton and a CUDA device')

FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16]


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')


def assert_close(actual, expected):
    """Dtype-aware tolerance |a - e| <= atol + rtol * |e| (llm.c grows it with magnitude).

    bf16 allows two units in the last place: Triton's CPU interpreter truncates float32 ->
    bf16 where torch rounds to nearest, so one ulp of disagreement is expected there.
    """
    tolerances = {torch.float64: (1e-12, 1e-12), torch.float32: (1e-5, 1e-6),
                  torch.bfloat16: (2 * 2.0 ** -7, 2.0 ** -7), torch.float16: (2e-3, 1e-3)}
    rtol, atol = tolerances[expected.dtype]
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


def hf_rope_tables(max_pos, head_dim, dtype, theta=10000.0):
    """cos/sin tables built as engine_interfaces.md states (Hugging Face Llama convention)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)  # (max_pos, D/2)
    emb = torch.cat([freqs, freqs], dim=-1)  # (max_pos, D)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def make_rope_case(seed, dtype, is_wrapped=True, is_strided=False, index_dtype=torch.int64,
                   device='cpu'):
    """Random packed step: independent logical positions and ring slots (drawn on the CPU)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    num_tokens = rng.randint(2, 9)
    num_q_heads, num_kv_heads = rng.randint(1, 6), rng.randint(1, 4)
    head_dim = rng.choice([2, 6, 8, 12, 16])
    num_slots = num_tokens + rng.randint(0, 10)
    max_pos = rng.randint(1, 40)
    shape_q, shape_kv = (num_tokens, num_q_heads, head_dim), (num_tokens, num_kv_heads, head_dim)
    if is_strided:  # q, k, v as views of one fused qkv projection output (token stride > row)
        width = (num_q_heads + 2 * num_kv_heads) * head_dim
        qkv = torch.randn(num_tokens, width, generator=gen, dtype=torch.float64)
        qkv = qkv.to(device=device, dtype=dtype)  # sliced on the device, so strides survive
        cut_q, cut_k = num_q_heads * head_dim, (num_q_heads + num_kv_heads) * head_dim
        q = qkv[:, :cut_q].view(shape_q)
        k, v = qkv[:, cut_q:cut_k].view(shape_kv), qkv[:, cut_k:].view(shape_kv)
    else:
        q = torch.randn(shape_q, generator=gen, dtype=torch.float64).to(dtype)
        k = torch.randn(shape_kv, generator=gen, dtype=torch.float64).to(dtype)
        v = torch.randn(shape_kv, generator=gen, dtype=torch.float64).to(dtype)
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen)
    if is_wrapped:  # a span that crosses the end of the ring
        start = num_slots - 1 - num_tokens // 2
        slot_mapping = (start + torch.arange(num_tokens)) % num_slots
    else:
        slot_mapping = torch.randperm(num_slots, generator=gen)[:num_tokens]
    cos_table, sin_table = hf_rope_tables(max_pos, head_dim, dtype)
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen,
                          dtype=torch.float64).to(dtype)
    v_cache = torch.randn(k_cache.shape, generator=gen, dtype=torch.float64).to(dtype)
    case = dict(q=q, k=k, v=v, positions=positions.to(index_dtype), cos_table=cos_table,
                sin_table=sin_table, k_cache=k_cache, v_cache=v_cache,
                slot_mapping=slot_mapping.to(index_dtype))
    return {name: x.to(device) for name, x in case.items()}


def fresh_caches(case):
    out = dict(case)
    out['k_cache'], out['v_cache'] = case['k_cache'].clone(), case['v_cache'].clone()
    return out


# ---------------------------------------------------------------- (1) pure-Python index planner

@pytest.mark.parametrize('seed', range(40))
def test_ring_shift_slots_moves_span_in_list_ring(seed):
    rng = random.Random(seed)
    capacity = rng.randint(1, 12)
    start, length = rng.randrange(capacity), rng.randint(0, capacity)
    shift = rng.randrange(capacity)
    ring = [('old', slot) for slot in range(capacity)]
    for i in range(length):
        ring[(start + i) % capacity] = ('token', i)
    src, dst = ring_shift_slots(start, length, shift, capacity)
    before = list(ring)
    for s, d in zip(src, dst):  # gather-then-write: read from the untouched copy
        ring[d] = before[s]
    # Walking the ring from the new start yields the tokens in order ...
    new_start = (start - shift) % capacity
    assert [ring[(new_start + i) % capacity] for i in range(length)] == \
        [('token', i) for i in range(length)]
    # ... and every slot outside the old and the new span keeps its content.
    touched = {(start + i) % capacity for i in range(length)}
    touched |= {(new_start + i) % capacity for i in range(length)}
    for slot in set(range(capacity)) - touched:
        assert ring[slot] == before[slot]
    assert len(set(dst)) == len(dst)


def test_ring_shift_slots_hand_example_and_noops():
    # ring of 8, span of 4 at slots 6,7,0,1 moved left by 3 -> slots 3,4,5,6
    assert ring_shift_slots(6, 4, 3, 8) == ([6, 7, 0, 1], [3, 4, 5, 6])
    assert ring_shift_slots(2, 0, 1, 8) == ([], [])
    assert ring_shift_slots(2, 5, 0, 8) == ([], [])


@pytest.mark.parametrize('kwargs, field', [
    (dict(start=0, length=1, shift=1, capacity=0), 'capacity'),
    (dict(start=8, length=1, shift=1, capacity=8), 'start'),
    (dict(start=-1, length=1, shift=1, capacity=8), 'start'),
    (dict(start=0, length=9, shift=1, capacity=8), 'length'),
    (dict(start=0, length=2, shift=8, capacity=8), 'shift'),
    (dict(start=0, length=2, shift=1.0, capacity=8), 'shift'),
])
def test_ring_shift_slots_rejects_bad_input(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ring_shift_slots(**kwargs)


# ------------------------------------------------------- (2) references vs independent oracles

def test_rope_ref_equals_complex_rotation():
    num_tokens, num_q_heads, num_kv_heads, head_dim, num_slots, max_pos = 5, 3, 2, 8, 7, 50
    theta = 500.0
    gen = torch.Generator().manual_seed(0)
    # float64 tables from float64 angles, so the oracle below shares no rounding with them
    j = torch.arange(head_dim // 2, dtype=torch.float64)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * theta ** (-2 * j / head_dim)
    cos_table = torch.cat([angles.cos(), angles.cos()], -1)
    sin_table = torch.cat([angles.sin(), angles.sin()], -1)
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=gen, dtype=torch.float64)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 49, 17])
    slot_mapping = torch.tensor([5, 6, 0, 1, 3])  # wraps around the ring of 7
    k_cache = torch.randn(num_slots, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    v_cache = torch.randn(k_cache.shape, generator=gen, dtype=torch.float64)
    old_k, old_v = k_cache.clone(), v_cache.clone()

    q_rot = rope_kv_write_ref(q, k, v, positions, cos_table, sin_table, k_cache, v_cache,
                              slot_mapping)

    def complex_rotate(x):  # pairs (d, d + D/2) form the complex number x_d + i x_{d+D/2}
        half = head_dim // 2
        z = torch.complex(x[..., :half], x[..., half:])
        z = z * torch.polar(torch.ones_like(angles[positions]), angles[positions])[:, None, :]
        return torch.cat([z.real, z.imag], -1)

    torch.testing.assert_close(q_rot, complex_rotate(q), rtol=1e-12, atol=1e-12)
    expected_k, expected_v = old_k.clone(), old_v.clone()
    expected_k[slot_mapping] = complex_rotate(k)
    expected_v[slot_mapping] = v
    torch.testing.assert_close(k_cache, expected_k, rtol=1e-12, atol=1e-12)
    assert torch.equal(v_cache, expected_v)
    assert torch.equal(k_cache[[2, 4]], old_k[[2, 4]])  # slots not in slot_mapping untouched


def test_rope_ref_position_zero_is_identity_and_tables_follow_hf():
    cos_table, sin_table = hf_rope_tables(4, 6, torch.float64)
    x = torch.randn(1, 2, 6, dtype=torch.float64)
    caches = torch.zeros(1, 2, 6, dtype=torch.float64), torch.zeros(1, 2, 6, dtype=torch.float64)
    out = rope_kv_write_ref(x, x, x, torch.tensor([0]), cos_table, sin_table, *caches,
                            torch.tensor([0]))
    assert torch.equal(out, x)
    # hand computation for D = 2: inv_freq = 1, so position p rotates (a, b) by p radians
    cos2, sin2 = hf_rope_tables(4, 2, torch.float64)
    pair = torch.tensor([[[1.0, 0.0]]], dtype=torch.float64)
    caches = torch.zeros(1, 1, 2, dtype=torch.float64), torch.zeros(1, 1, 2, dtype=torch.float64)
    out = rope_kv_write_ref(pair, pair, pair, torch.tensor([3]), cos2, sin2, *caches,
                            torch.tensor([0]))
    # the tables are float32 before the cast, so compare at float32 precision
    expected = torch.tensor([3.0], dtype=torch.float64)
    expected = torch.cat([expected.cos(), expected.sin()])
    torch.testing.assert_close(out[0, 0], expected, rtol=1e-6, atol=1e-6)


def python_loop_copy(cache, src, dst):
    old = cache.clone()
    out = cache.clone()
    for s, d in zip(src, dst):
        out[d] = old[s]
    return out


@pytest.mark.parametrize('seed', range(5))
def test_kv_copy_ref_equals_python_loop(seed):
    rng = random.Random(seed)
    num_slots = rng.randint(1, 20)
    num_rows = rng.randint(0, num_slots)
    dst = rng.sample(range(num_slots), num_rows)
    src = [rng.randrange(num_slots) for _ in range(num_rows)]  # may repeat and overlap dst
    k_cache, v_cache = torch.randn(num_slots, 2, 4), torch.randn(num_slots, 2, 4)
    expected_k = python_loop_copy(k_cache, src, dst)
    expected_v = python_loop_copy(v_cache, src, dst)
    kv_copy_ref(k_cache, v_cache, torch.tensor(src, dtype=torch.int64),
                torch.tensor(dst, dtype=torch.int64))
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_kv_copy_ref_reads_before_writing():
    labels = torch.arange(16, dtype=torch.float64)[:, None, None].expand(16, 1, 2).contiguous()
    k_cache, v_cache = labels.clone(), labels.clone() + 100
    # accepted tree path [5, 9, 12] compacted to [3, 4, 5]: slot 5 is read and then written
    kv_copy_ref(k_cache, v_cache, torch.tensor([5, 9, 12]), torch.tensor([3, 4, 5]))
    assert k_cache[:, 0, 0].tolist()[:7] == [0, 1, 2, 5, 9, 12, 6]
    # chained move [3, 5] -> [5, 7]: a naive in-order loop would put old 3 into slot 7
    k_cache = labels.clone()
    kv_copy_ref(k_cache, v_cache, torch.tensor([3, 5]), torch.tensor([5, 7]))
    assert k_cache[5, 0, 0] == 3 and k_cache[7, 0, 0] == 5


# ------------------------------------------------------ (3) Triton kernels vs their references

def run_rope_both(case, **triton_kwargs):
    ref_case, tri_case = fresh_caches(case), fresh_caches(case)
    expected = rope_kv_write_ref(**ref_case)
    actual = rope_kv_write_triton(**tri_case, **triton_kwargs)
    assert_close(actual, expected)
    assert_close(tri_case['k_cache'], ref_case['k_cache'])
    assert torch.equal(tri_case['v_cache'], ref_case['v_cache'])  # v is copied, never rounded


@needs_triton
@pytest.mark.parametrize('dtype', FLOAT_DTYPES)
@pytest.mark.parametrize('seed', [1, 2, 3])
def test_rope_kv_write_triton_matches_ref(interpret, dtype, seed):
    run_rope_both(make_rope_case(seed, dtype, is_wrapped=seed != 2, is_strided=seed == 3,
                                 index_dtype=torch.int32 if seed == 1 else torch.int64))


@needs_triton
@pytest.mark.parametrize('block_h', [1, 2])
def test_rope_kv_write_triton_small_head_blocks(interpret, block_h):
    # several q and k/v head groups per token, the last one partially masked
    case = make_rope_case(11, torch.float32)
    case['q'] = torch.randn(case['q'].shape[0], 5, case['q'].shape[2])
    run_rope_both(case, block_h=block_h)


@needs_triton
def test_rope_kv_write_packed_step_through_wrapper(interpret):
    # request A: prefill of 4 tokens at positions 0..3 in slots wrapping 14, 15, 0, 1;
    # request B: one decode token at position 9 in slot 7 (positions are logical, per request)
    case = make_rope_case(5, torch.float64)
    head_dim = case['q'].shape[2]
    num_kv_heads = case['k'].shape[1]
    gen = torch.Generator().manual_seed(5)
    for name, heads in (('q', 3), ('k', num_kv_heads), ('v', num_kv_heads)):
        case[name] = torch.randn(5, heads, head_dim, generator=gen, dtype=torch.float64)
    case['positions'] = torch.tensor([0, 1, 2, 3, 9])
    case['slot_mapping'] = torch.tensor([14, 15, 0, 1, 7])
    case['cos_table'], case['sin_table'] = hf_rope_tables(12, head_dim, torch.float64)
    case['k_cache'] = torch.randn(16, num_kv_heads, head_dim, generator=gen, dtype=torch.float64)
    case['v_cache'] = torch.randn(case['k_cache'].shape, generator=gen, dtype=torch.float64)
    ref_case, tri_case = fresh_caches(case), fresh_caches(case)
    expected = rope_kv_write(**ref_case)
    actual = rope_kv_write(**tri_case, use_triton=True)
    assert_close(actual, expected)
    assert_close(tri_case['k_cache'], ref_case['k_cache'])
    assert torch.equal(tri_case['v_cache'], ref_case['v_cache'])


@needs_triton
def test_rope_kv_write_empty_step(interpret):
    case = make_rope_case(4, torch.float32)
    for name in ('q', 'k', 'v', 'positions', 'slot_mapping'):
        case[name] = case[name][:0]
    before = case['k_cache'].clone()
    assert rope_kv_write(**case, use_triton=True).shape == (0,) + case['q'].shape[1:]
    assert torch.equal(case['k_cache'], before)


def overlapping_moves():
    return [
        ([5, 9, 12], [3, 4, 5]),  # accepted-path compaction
        ring_shift_slots(13, 7, 3, 16),  # wrapped span shifted left inside the ring
        ring_shift_slots(0, 16, 5, 16),  # whole ring rotated: every slot read and written
        ([2, 2, 7], [7, 0, 2]),  # repeated source, destinations that are sources
        ([], []),
    ]


@needs_triton
@pytest.mark.parametrize('dtype', FLOAT_DTYPES)
def test_kv_copy_triton_matches_ref_on_overlaps(interpret, dtype):
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(16, 3, 8, generator=gen, dtype=torch.float64).to(dtype)
    v_cache = torch.randn(16, 3, 8, generator=gen, dtype=torch.float64).to(dtype)
    for src, dst in overlapping_moves():
        ref = k_cache.clone(), v_cache.clone()
        tri = k_cache.clone(), v_cache.clone()
        kv_copy(*ref, src, dst)
        kv_copy(*tri, torch.tensor(src, dtype=torch.int32), dst, use_triton=True)
        assert torch.equal(tri[0], ref[0]) and torch.equal(tri[1], ref[1]), (src, dst)


@needs_triton
@pytest.mark.parametrize('seed', range(3))
def test_kv_copy_triton_random_with_partial_blocks(interpret, seed):
    rng = random.Random(seed)
    num_slots = rng.randint(2, 24)
    num_rows = rng.randint(1, num_slots)
    dst = torch.tensor(rng.sample(range(num_slots), num_rows))
    src = torch.tensor([rng.randrange(num_slots) for _ in range(num_rows)])
    k_cache, v_cache = torch.randn(num_slots, 2, 12), torch.randn(num_slots, 2, 12)
    expected = python_loop_copy(k_cache, src.tolist(), dst.tolist())
    expected_v = python_loop_copy(v_cache, src.tolist(), dst.tolist())
    kv_copy_triton(k_cache, v_cache, src, dst, block=16)  # rows of 24: a full and a half block
    assert torch.equal(k_cache, expected) and torch.equal(v_cache, expected_v)


@needs_cuda
def test_kernels_on_cuda_bf16(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    for seed in range(3):
        case = make_rope_case(seed, torch.bfloat16, is_strided=seed == 1, device='cuda')
        run_rope_both(case)
    k_cache = torch.randn(64, 8, 128, device='cuda', dtype=torch.bfloat16)
    v_cache = torch.randn_like(k_cache)
    src, dst = ring_shift_slots(50, 30, 7, 64)
    ref = k_cache.clone(), v_cache.clone()
    kv_copy(*ref, src, dst)
    kv_copy(k_cache, v_cache, src, dst, use_triton=True)
    assert torch.equal(k_cache, ref[0]) and torch.equal(v_cache, ref[1])


# ---------------------------------------------------------------- (4) wrapper validation errors

def _strided_last_dim(name):
    return lambda case: torch.cat([case[name], case[name]], dim=-1)[..., ::2]


ROPE_BAD_INPUTS = [
    ('q', lambda c: c['q'][0], 'q'),
    ('k', lambda c: c['k'].double(), 'k dtype'),
    ('cos_table', lambda c: c['cos_table'].double(), 'cos_table dtype'),
    ('positions', lambda c: c['positions'].float(), 'positions must be int64 or int32'),
    ('positions', lambda c: c['positions'].to('meta'), 'positions is on meta'),
    ('v', lambda c: c['v'][:, :1], 'v shape'),
    ('k', lambda c: c['k'][:1], 'k shape'),
    ('slot_mapping', lambda c: c['slot_mapping'][:-1], 'slot_mapping must have'),
    ('cos_table', lambda c: c['cos_table'][:, 1:], 'cos_table shape'),
    ('sin_table', lambda c: c['sin_table'][:1], 'sin_table shape'),
    ('k_cache', lambda c: c['k_cache'][:, :0], 'k_cache shape'),
    ('v_cache', lambda c: c['v_cache'][:1], 'v_cache shape'),
    ('q', _strided_last_dim('q'), 'q must have last-dim stride 1'),
    ('k_cache', _strided_last_dim('k_cache'), 'k_cache must have last-dim stride 1'),
    ('positions', lambda c: torch.stack([c['positions']] * 2, 1)[:, 0], 'positions must be con'),
    ('positions', lambda c: c['positions'] * 0 + c['cos_table'].shape[0], 'positions values'),
    ('positions', lambda c: c['positions'] * 0 - 1, 'positions values'),
    ('slot_mapping', lambda c: c['slot_mapping'] * 0, 'slot_mapping values must be unique'),
    ('slot_mapping', lambda c: c['slot_mapping'] + c['k_cache'].shape[0], 'slot_mapping values'),
    ('v_cache', lambda c: c['k_cache'], 'share memory'),
]


@pytest.mark.parametrize('name, mutate, message', ROPE_BAD_INPUTS)
def test_rope_kv_write_rejects_bad_input(name, mutate, message):
    case = make_rope_case(7, torch.float32)
    case[name] = mutate(case)
    with pytest.raises(ValueError, match=message):
        rope_kv_write(**case)


def test_rope_kv_write_rejects_odd_head_dim_and_non_tensor():
    case = make_rope_case(7, torch.float32)
    odd = dict(case, q=case['q'][..., :-1])
    with pytest.raises(ValueError, match='head_dim must be even'):
        rope_kv_write(**odd)
    with pytest.raises(ValueError, match='slot_mapping must be a torch.Tensor'):
        rope_kv_write(**dict(case, slot_mapping=[0, 1]))


def test_rope_kv_write_default_path_is_ref_and_index_checks_can_be_skipped():
    case = make_rope_case(8, torch.float64)
    ref_case, wrap_case = fresh_caches(case), fresh_caches(case)
    expected = rope_kv_write_ref(**ref_case)
    actual = rope_kv_write(**wrap_case, check_indices=False)
    assert torch.equal(actual, expected) and torch.equal(wrap_case['k_cache'], ref_case['k_cache'])


def test_use_triton_without_gpu_or_interpreter_is_refused(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    case = make_rope_case(9, torch.float32)
    with pytest.raises(ValueError, match='use_triton'):
        rope_kv_write(**case, use_triton=True)
    with pytest.raises(ValueError, match='use_triton'):
        kv_copy(case['k_cache'], case['v_cache'], [0], [1], use_triton=True)


def test_is_triton_available_follows_interpreter_flag(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert _triton_util.is_triton_available() == _triton_util.HAS_TRITON
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    expected = _triton_util.HAS_TRITON and torch.cuda.is_available()
    assert _triton_util.is_triton_available() == expected


KV_COPY_BAD_INPUTS = [
    (dict(dst_slots=[3, 3]), 'dst_slots values must be unique'),
    (dict(dst_slots=[3, 16]), 'dst_slots values'),
    (dict(src_slots=[-1, 0]), 'src_slots values'),
    (dict(dst_slots=[3]), 'dst_slots has 1 entries'),
    (dict(src_slots=torch.tensor([0.0, 1.0])), 'src_slots must be int64 or int32'),
    (dict(src_slots=[[0, 1]]), 'src_slots must have 1 dims'),
    (dict(src_slots=['a', 'b']), 'src_slots must be'),
    (dict(v_cache=torch.zeros(16, 2, 4, dtype=torch.float64)), 'v_cache dtype'),
    (dict(v_cache=torch.zeros(15, 2, 4)), 'v_cache shape'),
    (dict(k_cache=torch.zeros(2, 16, 4).transpose(0, 1)), 'k_cache must be contiguous'),
    (dict(k_cache=torch.zeros(16, 2, 4, dtype=torch.int32)), 'k_cache must be a floating'),
    (dict(dst_slots=torch.tensor([1, 2], device='meta')), 'dst_slots is on meta'),
]


@pytest.mark.parametrize('override, message', KV_COPY_BAD_INPUTS)
def test_kv_copy_rejects_bad_input(override, message):
    args = dict(k_cache=torch.zeros(16, 2, 4), v_cache=torch.zeros(16, 2, 4),
                src_slots=[0, 1], dst_slots=[2, 3])
    args.update(override)
    with pytest.raises(ValueError, match=message):
        kv_copy(**args)
