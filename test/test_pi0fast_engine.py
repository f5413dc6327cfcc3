"""The engine made general for pi0-FAST's shape, each fast path against its plain reference:

- the prefill's bidirectional prefix (``models/attention.prefill_allowed``): segments attention
  with padded prefill blocks (what CUDA-graph buckets do) equals the dense reference and the
  unpadded step bit for bit on the real rows: the padding rows are masked, not hidden by
  causality; drafted chain rows after the prompt stay causal;
- one KV head and a head size other than width / heads (Gemma-2B: 8 x 256 over 1 KV head):
  the KV cache shape, and the Triton kernels (segment attention, RoPE + KV write) against their
  references under ``TRITON_INTERPRET=1`` at D = 256 with one KV head;
- Gemma's scaled token embeddings reach the EAGLE draft head (``token_embeddings``);
- ``restrict_to_action_tokens`` leaves the codec's end marker and text tokens reachable;
- relaxed acceptance refused, when the engine is configured, for a codec without a distance.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.device.packed_forward import PackedForward
from vla_spec_ros.engine.device.runner import ModelRunner, dense_batch
from vla_spec_ros.engine.device.step_inputs import PrefillRows, chain_rows, pack_step
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.models import registry
from vla_spec_ros.models.attention import KVCache, prefill_allowed
from vla_spec_ros.models.draft import new_draft_head
from vla_spec_ros.models.pi0fast.family import build_model
from vla_spec_ros.models.registry import preset

from kernel_checks import assert_close, needs_triton

SCRATCH = 63


@pytest.fixture(scope='module')
def lm():
    torch.manual_seed(0)
    return build_model(preset('pi0fast-tiny'), torch.float64, seed=1).language_model


def hidden_of(lm, step, embeds):
    """Run one packed step (the engine's static-buffer path) over a fresh 64-slot cache."""
    cache = lm.new_kv_cache(SCRATCH + 1)
    forward = PackedForward(lambda batch, ints, dense: {
        'hidden': lm.forward_hidden(dense['x'], batch, cache)}, 'cpu')
    return forward(step, {'x': embeds})['hidden'], cache


def test_the_prefill_rule_is_causal_plus_the_prefix():
    allowed = prefill_allowed(5, torch.tensor([0, 3]))
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    assert torch.equal(allowed[0], causal)
    expected = causal.clone()
    expected[:, :3] = True
    assert torch.equal(allowed[1], expected)


def test_bidirectional_prefill_padded_equals_tight_and_dense(lm):
    """Two frames' prefills (prompts 9 and 7 rows, the second with a drafted chain of 2), a
    decode segment; tight blocks, blocks padded to 16 rows with garbage padding embeddings,
    and the dense reference give the same hidden states on every real row."""
    gen = torch.Generator().manual_seed(3)
    width = lm.cfg.hidden_size
    prefills = [PrefillRows(0, SCRATCH, 9, (), 9), PrefillRows(20, SCRATCH, 7, (5, 6), 7)]
    segment = chain_rows(40, SCRATCH, 0, [11])
    prompts = [torch.randn(9, width, generator=gen, dtype=torch.float64),
               torch.randn(9, width, generator=gen, dtype=torch.float64)]
    prompts[1][7:] = lm.token_embeddings(torch.tensor([5, 6]))        # the chain rows
    decode = lm.token_embeddings(torch.tensor([11]))
    tight = pack_step(prefills, [segment], SCRATCH)
    real, _ = hidden_of(lm, tight, torch.cat(prompts + [decode]))
    padded_step = pack_step(prefills, [segment], SCRATCH, prefill_rows=16)
    garbage = [torch.randn(7, width, generator=gen, dtype=torch.float64) * 50
               for _ in range(2)]
    padded, _ = hidden_of(lm, padded_step, torch.cat([prompts[0], garbage[0], prompts[1],
                                                      garbage[1], decode]))
    real_rows = list(range(9)) + list(range(16, 25)) + [32]
    # Equal to float64 rounding (the blocks' products have other shapes); padding read by a
    # real row would move it by order one (the garbage rows are 50 times the prompt's scale).
    torch.testing.assert_close(padded[real_rows], real, rtol=1e-12, atol=1e-12)
    # the dense reference (one T x slots mask, ``dense_batch``)
    cache = lm.new_kv_cache(SCRATCH + 1)
    forward = PackedForward(lambda batch, ints, dense: {'hidden': lm.forward_hidden(
        dense['x'], dense_batch(batch, cache.num_slots), cache)}, 'cpu')
    dense = forward(tight, {'x': torch.cat(prompts + [decode])})['hidden']
    torch.testing.assert_close(dense, real, rtol=1e-12, atol=1e-12)
    # and the prefix matters: a causal prefill of the same rows differs on the prompt rows
    causal, _ = hidden_of(lm, pack_step([PrefillRows(0, SCRATCH, 9), PrefillRows(
        20, SCRATCH, 7, (5, 6))], [segment], SCRATCH), torch.cat(prompts + [decode]))
    assert not torch.allclose(causal[:8], real[:8])


def test_chain_rows_after_a_bidirectional_prompt_stay_causal(lm):
    """A chain row's output does not depend on the chain rows after it."""
    gen = torch.Generator().manual_seed(4)
    prompt = torch.randn(6, lm.cfg.hidden_size, generator=gen, dtype=torch.float64)
    outs = []
    for chain in ((5, 6, 7), (5, 6, 9)):
        step = pack_step([PrefillRows(0, SCRATCH, 6, chain, 6)], [], SCRATCH)
        embeds = torch.cat([prompt, lm.token_embeddings(torch.tensor(chain))])
        outs.append(hidden_of(lm, step, embeds)[0])
    assert torch.equal(outs[0][:8], outs[1][:8])
    assert not torch.equal(outs[0][8], outs[1][8])


def test_one_kv_head_and_an_explicit_head_size_reach_the_cache(lm):
    cfg = lm.cfg
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (4, 1, 16)
    assert cfg.head_dim != cfg.hidden_size // cfg.num_heads
    cache = lm.new_kv_cache(10)
    assert isinstance(cache, KVCache) and cache.k[0].shape == (10, 1, 16)
    assert preset('pi0fast-tiny').llm.head_dim == 16


def test_the_draft_head_embeds_like_the_verifier(lm):
    head = new_draft_head(lm, seed=0, dtype=torch.float64)
    ids = torch.tensor([3, 50, 700])
    assert torch.equal(head.embed(ids), lm.token_embeddings(ids))
    assert not torch.equal(head.embed(ids), lm.model.embed_tokens(ids))   # sqrt(width) scale


@pytest.fixture(scope='module')
def loaded(tmp_path_factory):
    return registry.load(registry.make_checkpoint(
        'pi0fast-tiny', tmp_path_factory.mktemp('pi0fast'), seed=1), torch.float64)


def test_restricted_greedy_keeps_the_end_marker(loaded):
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer,
                         EngineConfig(dtype='float64', restrict_to_action_tokens=True))
    first, last = loaded.codec.action_token_range()
    mask = runner._action_mask
    assert mask[loaded.codec.end_token] == 0 and mask[first] == 0 and mask[last] == 0
    assert all(mask[t] == 0 for t in loaded.codec.text_tokens)     # "Action: ", "|", EOS
    assert int((mask == 0).sum()) == last - first + 1 + len(set(loaded.codec.text_tokens))
    assert mask[first - 1] == float('-inf')


def test_relaxed_acceptance_refused_for_a_codec_without_a_distance(loaded):
    from vla_spec_ros.codecs.fast import FastActionCodec
    c = loaded.codec
    strict = FastActionCodec(c.tokenizer, vocab_size=c.vocab_size, end_token=c.end_token,
                             skip_tokens=c.skip_tokens, prefix_tokens=c.prefix_tokens,
                             suffix_tokens=c.suffix_tokens, max_tokens=c.max_tokens,
                             relaxed_acceptance=False)
    config = EngineConfig(dtype='float64', mode='spec', relax_threshold=2)
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=strict)
    with pytest.raises(ValueError, match='relax_threshold'):
        Engine(runner, {}, config)
    engine = Engine(runner, {}, config.replace(relax_threshold=0))
    with pytest.raises(ValueError, match='relax_threshold'):
        engine.set_tunables(relax_threshold=1)
    Engine(ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config), {}, config)


def test_a_frame_refuses_more_images_than_slots_and_a_state_openvla_cannot_read(loaded):
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, EngineConfig())
    image = np.zeros((28, 28, 3), np.uint8)
    from vla_spec_ros.engine.result import Frame
    with pytest.raises(ValueError, match='4 images'):
        runner.check_frame(Frame((image,) * 4, 'open the drawer'))
    runner.check_frame(Frame((image,) * 3, 'open the drawer', state=np.zeros(4)))
    with pytest.raises(ValueError, match='state'):
        runner.prompt_ids('open the drawer', np.zeros(9))      # state_dim is 4
    # No state: the normalised zero state, i.e. the statistics' mean (MEAN_STD).
    mean = loaded.tokenizer.state_normalizer.stats['mean']
    assert runner.prompt_ids('open', None) == runner.prompt_ids('open', mean)


# ---- kernels at Gemma-2B's attention shape (one KV head, D = 256) -------------------------

@needs_triton
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_segment_attention_kernel_with_one_kv_head_of_256(interpret, dtype):
    from test_segment_attention_kernel import make_case, run_both
    run_both(make_case(7, dtype, 2, 3, 40, 8, 1, 256))


@needs_triton
@pytest.mark.parametrize('dtype', [torch.float64, torch.float32])
def test_rope_kv_write_kernel_with_one_kv_head_of_256(interpret, dtype):
    try:
        from kernels.rope_kv_write import rope_kv_write_ref, rope_kv_write_triton
    except ImportError:
        from vla_spec_ros.kernels.rope_kv_write import rope_kv_write_ref, rope_kv_write_triton
    from vla_spec_ros.models.rope import rope_tables
    gen = torch.Generator().manual_seed(5)
    num_tokens, head_dim = 5, 256
    q = torch.randn(num_tokens, 8, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(num_tokens, 1, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(num_tokens, 1, head_dim, generator=gen, dtype=torch.float64).to(dtype)
    cos_table, sin_table = rope_tables(head_dim, 32, 10000.0, dtype)
    positions = torch.tensor([0, 1, 2, 30, 7])
    slots = torch.tensor([9, 0, 1, 2, 5])
    caches = [tuple(torch.zeros(10, 1, head_dim, dtype=dtype) for _ in range(2))
              for _ in range(2)]
    expected = rope_kv_write_ref(q, k, v, positions, cos_table, sin_table, *caches[0], slots)
    actual = rope_kv_write_triton(q, k, v, positions, cos_table, sin_table, *caches[1], slots)
    assert_close(actual, expected)
    assert_close(caches[1][0], caches[0][0])
    assert torch.equal(caches[1][1], caches[0][1])
