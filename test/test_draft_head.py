"""The EAGLE draft head: structure, forward against a hand-written reference, checkpoint I/O.

The reference forward below is written from docs/speculation.md, Draft head (fc over
cat(embedding, feature) with bias, one Llama layer WITHOUT input norm, post-attention norm and
SwiGLU MLP, no final norm, logits from the verifier's lm_head) in plain torch, independent of
models/layers.py.
"""
import json
import math
import shutil
import types

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vla_spec_ros import assets
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import causal_batch
from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
from vla_spec_ros.engine.drafting.eagle_drafter import EagleDrafter
from vla_spec_ros.models.openvla.checkpoint import CheckpointError, load_model
from vla_spec_ros.models import registry
from vla_spec_ros.models.draft import (FINGERPRINT_KEY, DraftConfig, EagleDraftHead, load_draft,
                                       new_draft_head, save_draft)
from vla_spec_ros.models.layers import PLAIN
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

# The EAGLE / Spec-VLA state-dict keys of a one-layer draft (reference §1), embedding excluded.
EAGLE_KEYS = {'fc.weight', 'fc.bias', 'layers.0.post_attention_layernorm.weight',
              *(f'layers.0.self_attn.{p}_proj.weight' for p in 'qkvo'),
              *(f'layers.0.mlp.{p}_proj.weight' for p in ('gate', 'up', 'down'))}


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('ckpt') / 'tiny', seed=0)


@pytest.fixture(scope='module')
def verifier(checkpoint):
    model, _, _ = load_model(checkpoint, torch.float64)
    return model


@pytest.fixture(scope='module')
def head(verifier):
    return new_draft_head(verifier, seed=3)


@pytest.fixture
def saved(head, tmp_path):
    return save_draft(head, tmp_path / 'draft')


def reference_forward(head, embeds, features):
    """Plain-torch EAGLE layer over one causal sequence at positions 0..T-1."""
    cfg = head.cfg
    d = cfg.hidden_size // cfg.num_heads
    layer = head.layers[0]
    attn, mlp = layer.self_attn, layer.mlp
    x = torch.cat([embeds, features], -1) @ head.fc.weight.T + head.fc.bias
    t = x.shape[0]
    q = (x @ attn.q_proj.weight.T).view(t, cfg.num_heads, d)
    k = (x @ attn.k_proj.weight.T).view(t, cfg.num_kv_heads, d)
    v = (x @ attn.v_proj.weight.T).view(t, cfg.num_kv_heads, d)
    # RoPE angles in float32, as Hugging Face Llama computes them.
    inv_freq = 1.0 / cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    angle = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq[None]
    cos = torch.cat([angle.cos(), angle.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([angle.sin(), angle.sin()], -1)[:, None].to(x.dtype)

    def rotate(y):
        return y * cos + torch.cat([-y[..., d // 2:], y[..., :d // 2]], -1) * sin

    q, k = rotate(q), rotate(k)
    rep = cfg.num_heads // cfg.num_kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = torch.einsum('qhd,khd->hqk', q, k) / math.sqrt(d)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    probs = scores.masked_fill(~causal, float('-inf')).softmax(-1)
    out = torch.einsum('hqk,khd->qhd', probs, v).reshape(t, -1)
    x = x + out @ attn.o_proj.weight.T
    w = layer.post_attention_layernorm.weight
    n = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w
    gate = n @ mlp.gate_proj.weight.T
    return x + (gate * torch.sigmoid(gate) * (n @ mlp.up_proj.weight.T)) @ mlp.down_proj.weight.T


def random_inputs(head, length, seed=0):
    gen = torch.Generator().manual_seed(seed)
    h = head.cfg.hidden_size
    return (torch.randn(length, h, generator=gen, dtype=torch.float64),
            torch.randn(length, h, generator=gen, dtype=torch.float64))


# ---- structure --------------------------------------------------------------------------------

def test_state_dict_keys_are_the_eagle_names(head):
    assert set(head.state_dict()) == EAGLE_KEYS
    assert head.layers[0].input_layernorm is None
    assert head.fc.bias is not None and head.fc.weight.shape == (64, 128)


def test_embedding_and_lm_head_are_shared_not_registered(head, verifier):
    lm = verifier.language_model
    assert head.embed_tokens is lm.model.embed_tokens
    assert head.lm_head is lm.lm_head
    own = {id(p) for p in head.parameters()}
    assert id(lm.lm_head.weight) not in own and id(lm.model.embed_tokens.weight) not in own
    assert sum(p.numel() for p in head.parameters()) == sum(
        v.numel() for v in head.state_dict().values())


def test_config_defaults_to_verifier_layer_shape(verifier):
    llm = verifier.cfg.llm
    cfg = DraftConfig.from_verifier(llm)
    assert (cfg.hidden_size, cfg.num_heads, cfg.intermediate_size, cfg.vocab_size) == (
        llm.hidden_size, llm.num_heads, llm.intermediate_size, llm.vocab_size)
    assert cfg.num_layers == 1
    with pytest.raises(ValueError, match='num_heads'):
        DraftConfig(64, 0, 4, 160, 1e-6, 1e4, 1088, 512)
    with pytest.raises(ValueError, match='hidden_size'):
        DraftConfig(66, 4, 4, 160, 1e-6, 1e4, 1088, 512)


def test_forward_matches_hand_written_eagle_layer(head):
    embeds, feats = random_inputs(head, 9)
    cache = head.new_kv_cache(9)
    out = head(embeds, feats, causal_batch(0, 9, 'cpu'), cache)
    assert out.shape == (9, head.cfg.hidden_size)
    torch.testing.assert_close(out, reference_forward(head, embeds, feats), rtol=1e-10,
                               atol=1e-10)
    logits = head.logits(out)
    assert logits.shape == (9, head.cfg.vocab_size)
    torch.testing.assert_close(logits, out @ head.lm_head.weight.T)


def test_embedding_goes_first_in_the_fc_input(head):
    """Swapping embedding and feature changes the output (the order is part of the format)."""
    embeds, feats = random_inputs(head, 4, seed=1)
    a = head(embeds, feats, causal_batch(0, 4, 'cpu'), head.new_kv_cache(4))
    b = head(feats, embeds, causal_batch(0, 4, 'cpu'), head.new_kv_cache(4))
    assert not torch.allclose(a, b)
    expected = reference_forward(head, embeds, feats)
    torch.testing.assert_close(a, expected, rtol=1e-10, atol=1e-10)


# ---- checkpoint I/O ---------------------------------------------------------------------------

def test_save_load_round_trip(head, verifier, saved):
    with safe_open(str(saved / 'model.safetensors'), framework='pt') as f:
        assert set(f.keys()) == EAGLE_KEYS
    config = json.loads((saved / 'config.json').read_text())
    assert config['num_hidden_layers'] == 1 and config['hidden_size'] == 64
    loaded = load_draft(saved, verifier, torch.float64, 'cpu')
    assert loaded.embed_tokens is verifier.language_model.model.embed_tokens
    for key, value in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    embeds, feats = random_inputs(head, 5, seed=2)
    a = head(embeds, feats, causal_batch(0, 5, 'cpu'), head.new_kv_cache(5))
    b = loaded(embeds, feats, causal_batch(0, 5, 'cpu'), loaded.new_kv_cache(5))
    assert torch.equal(a, b)


def test_loads_onto_the_language_model_and_in_other_dtypes(verifier, saved):
    loaded = load_draft(saved, verifier.language_model, torch.float32, 'cpu')
    assert loaded.fc.weight.dtype == torch.float32


def test_eagle_style_extra_keys_accepted(head, verifier, saved):
    state = load_file(str(saved / 'model.safetensors'))
    # Spec-VLA ships its own 32000-row embedding for OpenVLA's padded vocab: fewer rows is fine.
    state['embed_tokens.weight'] = torch.zeros(1024, 64)
    state['layers.0.self_attn.rotary_emb.inv_freq'] = torch.zeros(8)
    save_file(state, str(saved / 'model.safetensors'))
    (saved / 'config.json').unlink()        # absent config: the verifier's layer shape
    loaded = load_draft(saved, verifier, torch.float64, 'cpu')
    assert torch.equal(loaded.fc.weight, head.fc.weight)


def test_embedding_key_must_fit_the_verifier(verifier, saved):
    state = load_file(str(saved / 'model.safetensors'))
    state['embed_tokens.weight'] = torch.zeros(1088, 32)
    save_file(state, str(saved / 'model.safetensors'))
    with pytest.raises(CheckpointError, match='embed_tokens.weight'):
        load_draft(saved, verifier)


@pytest.mark.parametrize('change, message', [
    ('drop', 'missing key layers.0.mlp.up_proj.weight'),
    ('extra', 'unexpected key layers.0.input_layernorm.weight'),
    ('shape', r'key layers.0.mlp.up_proj.weight has shape \(160, 32\)'),
])
def test_bad_keys_are_named(verifier, saved, change, message):
    state = load_file(str(saved / 'model.safetensors'))
    if change == 'drop':
        del state['layers.0.mlp.up_proj.weight']
    elif change == 'extra':
        state['layers.0.input_layernorm.weight'] = torch.ones(64)
    else:
        state['layers.0.mlp.up_proj.weight'] = torch.zeros(160, 32)
    save_file(state, str(saved / 'model.safetensors'))
    with pytest.raises(CheckpointError, match=message):
        load_draft(saved, verifier)


def test_truncated_file_is_named(verifier, saved):
    path = saved / 'model.safetensors'
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 100])
    with pytest.raises(CheckpointError, match='truncated') as info:
        load_draft(saved, verifier)
    assert str(path) in str(info.value)


def test_pickle_weights_refused(verifier, saved):
    (saved / 'model.safetensors').unlink()
    (saved / 'pytorch_model.bin').write_bytes(b'not read')
    with pytest.raises(CheckpointError, match='only safetensors'):
        load_draft(saved, verifier)


def test_config_errors(verifier, saved, tmp_path):
    config = json.loads((saved / 'config.json').read_text())
    (saved / 'config.json').write_text(json.dumps({**config, 'rope_scaling': {'factor': 2}}))
    with pytest.raises(CheckpointError, match='rope_scaling'):
        load_draft(saved, verifier)
    (saved / 'config.json').write_text(json.dumps({**config, 'hidden_size': 128}))
    with pytest.raises(CheckpointError, match='hidden_size'):
        load_draft(saved, verifier)
    with pytest.raises(CheckpointError, match='does not exist'):
        load_draft(tmp_path / 'nowhere', verifier)


def test_num_layers_and_config_from_json(verifier, tmp_path):
    cfg = DraftConfig.from_verifier(verifier.cfg.llm, num_layers=2)
    head = new_draft_head(verifier, cfg, seed=1)
    assert head.layers[1].input_layernorm is not None     # only layer 0 lacks the input norm
    loaded = load_draft(save_draft(head, tmp_path / 'two'), verifier)
    assert loaded.cfg == cfg
    assert isinstance(loaded, EagleDraftHead)


# ---- load_draft_for ---------------------------------------------------------------------------

def _runner(verifier):
    return types.SimpleNamespace(model=verifier, dtype=torch.float64,
                                 device=torch.device('cpu'), max_action_tokens=7,
                                 max_prefix_len=lambda num_instruction_tokens: 64,
                                 kernels_for=lambda config: PLAIN)


def test_load_draft_for_resolves_draft_path(verifier, head, checkpoint, tmp_path):
    runner = _runner(verifier)
    config = EngineConfig(mode='spec', dtype='float64', draft_path='checkpoint')
    with pytest.raises(ValueError, match='draft_path.*has none'):
        load_draft_for(runner, config, tmp_path)
    with pytest.raises(ValueError, match='draft_path.*has none'):
        load_draft_for(runner, config, None)
    folder = tmp_path / 'ckpt'
    folder.mkdir()
    shutil.copytree(save_draft(head, tmp_path / 'saved'), folder / 'draft')
    drafter = load_draft_for(runner, config, folder)
    assert isinstance(drafter, EagleDrafter)
    assert torch.equal(drafter.head.fc.weight, head.fc.weight)
    explicit = load_draft_for(runner, config.replace(draft_path=str(tmp_path / 'saved')), None)
    assert torch.equal(explicit.head.fc.weight, head.fc.weight)
    with pytest.raises(CheckpointError, match='does not exist'):
        load_draft_for(runner, config.replace(draft_path=str(tmp_path / 'none')), None)


def test_random_draft_is_seeded(verifier):
    runner = _runner(verifier)
    config = EngineConfig(mode='spec', dtype='float64', draft_path='random')
    a = load_draft_for(runner, config, None).head
    b = load_draft_for(runner, config, None).head
    c = load_draft_for(runner, config.replace(seed=1), None).head
    assert torch.equal(a.fc.weight, b.fc.weight)
    assert not torch.equal(a.fc.weight, c.fc.weight)
    assert a.fc.weight.dtype == torch.float64


def test_reads_a_spec_vla_style_config(verifier, saved):
    """HF Llama keys as Spec-VLA's llama_2_chat_7B_config.json has them (tiny dims)."""
    (saved / 'config.json').write_text(json.dumps({
        'architectures': ['LlamaForCausalLM'], 'bos_token_id': 1, 'eos_token_id': 2,
        'hidden_act': 'silu', 'hidden_size': 64, 'initializer_range': 0.02,
        'intermediate_size': 160, 'max_position_embeddings': 4096, 'model_type': 'llama',
        'num_attention_heads': 4, 'num_hidden_layers': 1, 'num_key_value_heads': 4,
        'pad_token_id': 0, 'pretraining_tp': 1, 'rms_norm_eps': 1e-05, 'rope_scaling': None,
        'tie_word_embeddings': False, 'torch_dtype': 'float16', 'use_cache': True,
        'vocab_size': 1024}))
    cfg = load_draft(saved, verifier).cfg
    assert cfg.rope_theta == 10000.0            # EAGLE's EConfig has no rope_theta
    assert cfg.rms_norm_eps == 1e-05 and cfg.max_position_embeddings == 4096


# ---- which verifier a head fits -----------------------------------------------------------------

def _rewrite_config(saved, **changes):
    config = json.loads((saved / 'config.json').read_text())
    (saved / 'config.json').write_text(json.dumps({**config, **changes}))


def test_save_records_the_verifier_fingerprint(saved):
    fingerprint = json.loads((saved / 'config.json').read_text())[FINGERPRINT_KEY]
    assert set(fingerprint) == {'embed_tokens', 'lm_head'}
    assert all(len(values) == 64 for values in fingerprint.values())


@pytest.mark.parametrize('change, message', [
    ({'vocab_size': 99999}, 'vocab_size 99999 != verifier vocab_size 1024 or 1088'),
    ({'vocab_size': 576}, 'vocab_size 576 != verifier'),
    ({'max_position_embeddings': 4}, "max_position_embeddings 4 < the verifier's 512"),
])
def test_a_head_of_another_shape_is_refused(verifier, saved, change, message):
    _rewrite_config(saved, **change)
    with pytest.raises(CheckpointError, match=message) as info:
        load_draft(saved, verifier)
    assert str(saved / 'config.json') in str(info.value)


def test_a_head_trained_for_another_verifier_is_refused(saved, tmp_path):
    """Same shapes, another model's weights: the fingerprint names the head and the model."""
    other_folder = make_checkpoint('tiny', tmp_path / 'other', seed=1)
    other, _, _ = load_model(other_folder, torch.float64)
    with pytest.raises(CheckpointError, match='trained for another verifier') as info:
        load_draft(saved, other, verifier_name=str(other_folder))
    assert str(saved / 'config.json') in str(info.value)
    assert str(other_folder) in str(info.value)
    runner = _runner(other)
    config = EngineConfig(mode='spec', dtype='float64', draft_path=str(saved))
    with pytest.raises(CheckpointError, match=f'another verifier than {other_folder}'):
        load_draft_for(runner, config, other_folder)


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_the_fingerprint_holds_in_every_dtype(checkpoint, saved, dtype):
    """The head saved against the float64 verifier loads onto the same weights in any dtype."""
    model, _, _ = load_model(checkpoint, dtype)
    assert load_draft(saved, model).fc.weight.dtype == dtype


def test_a_head_saved_without_fingerprint_loads_when_it_fits(verifier, saved):
    config = json.loads((saved / 'config.json').read_text())
    del config[FINGERPRINT_KEY]
    (saved / 'config.json').write_text(json.dumps(config))
    assert load_draft(saved, verifier).cfg.vocab_size == 1088


@pytest.mark.parametrize('fingerprint', [[1.0], {'embed_tokens': [0.0] * 64},
                                         {'embed_tokens': ['x'] * 64, 'lm_head': [0.0] * 64}])
def test_a_malformed_fingerprint_is_named(verifier, saved, fingerprint):
    _rewrite_config(saved, **{FINGERPRINT_KEY: fingerprint})
    with pytest.raises(CheckpointError, match=f'{FINGERPRINT_KEY}.(embed_tokens|lm_head)'):
        load_draft(saved, verifier)


def test_the_embedded_head_fits_its_model_only():
    """The metaworld-demo head carries its verifier's fingerprint; the reasoning model (vocab
    832) refuses it instead of drafting tokens of another vocabulary."""
    head_folder = assets.embedded_checkpoint('metaworld-demo') / 'draft'
    assert FINGERPRINT_KEY in json.loads((head_folder / 'config.json').read_text())
    demo = registry.load(assets.embedded_checkpoint('metaworld-demo'), torch.float32).model
    assert load_draft(head_folder, demo).cfg.vocab_size == 576
    reason = registry.load(assets.embedded_checkpoint('metaworld-demo-reason'),
                           torch.float32).model
    with pytest.raises(CheckpointError, match='vocab_size 576 != verifier vocab_size 768 or '
                                              '832'):
        load_draft(head_folder, reason)
