"""Kernels vs their references, the references vs independent oracles, and wrapper validation.

Layers: (1) the torch reference against an independent computation (RoPE as a complex-number
rotation); (2) the Triton kernel against its reference on random shapes under
``TRITON_INTERPRET=1`` (CPU) and, when present, on CUDA with bf16 tolerance; (3) the wrapper's
ValueErrors. Kernels are jitted at launch time, so the ``interpret`` fixture
turns the interpreter on for one test only (monkeypatch.setenv) regardless of import order.
"""
import random

import pytest
import torch

try:
    from kernels import _triton_util
    from kernels.rope_kv_write import rope_kv_write, rope_kv_write_ref, rope_kv_write_triton
except ImportError:  # installed layout: the folder ships as vla_spec_ros.kernels
    from vla_spec_ros.kernels import _triton_util
    from vla_spec_ros.kernels.rope_kv_write import (rope_kv_write, rope_kv_write_ref,
                                                    rope_kv_write_triton)

from kernel_checks import assert_close, needs_cuda, needs_triton

FLOAT_DTYPES = [torch.float32, torch.float64, torch.bfloat16]


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


# ---------------------------------------------------- (1) the reference vs an independent oracle

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


# ------------------------------------------------------ (2) the Triton kernel vs its reference

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


@needs_cuda
def test_kernels_on_cuda_bf16(monkeypatch):
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    for seed in range(3):
        case = make_rope_case(seed, torch.bfloat16, is_strided=seed == 1, device='cuda')
        run_rope_both(case)


# ---------------------------------------------------------------- (3) wrapper validation errors

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


def test_is_triton_available_follows_interpreter_flag(monkeypatch):
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert _triton_util.is_triton_available() == _triton_util.HAS_TRITON
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    expected = _triton_util.HAS_TRITON and torch.cuda.is_available()
    assert _triton_util.is_triton_available() == expected
