"""Model parity: our Llama vs transformers' ``LlamaForCausalLM`` on the same weights, the vision
towers vs a plain re-computation from the raw checkpoint tensors, and the prompt layout
(docs/openvla.md, Architecture; S1).

float32: logits within 1e-5 relative and identical greedy tokens. float64: identical tokens
from HF ``generate`` and ``VLAPolicy.predict``. HF's ``LlamaRMSNorm`` normalises in float32
even for float64 inputs, so float64 logits differ by ~1e-7 relative; with that one piece of
arithmetic reproduced, they agree to float64 precision (tested below).
"""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from vla_spec_ros.baseline import generate_tokens
from vla_spec_ros.engine.ar import causal_batch
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models import layers
from vla_spec_ros.models.openvla.baseline import HFBaseline
from vla_spec_ros.models.openvla.preprocess import preprocess_image
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.policy import VLAPolicy

INSTRUCTIONS = ('pick up the red cup', 'open the top drawer of the cabinet',
                'push the small blue block slowly to the left then lift it up', 'close it')
UNNORM_KEY = 'bridge_orig'
LN_EPS = 1e-6            # timm ViT LayerNorm eps, both towers


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('parity') / 'tiny', seed=3)


@pytest.fixture(scope='module')
def policies(folder):
    return {dtype: VLAPolicy.from_pretrained(str(folder), dtype=dtype)
            for dtype in ('float32', 'float64')}


@pytest.fixture(scope='module')
def baselines(policies):
    return {dtype: HFBaseline(p.engine.runner, p.config) for dtype, p in policies.items()}


@pytest.fixture(scope='module')
def raw_weights(folder):
    return {k: v.to(torch.float64) for k, v in load_file(str(folder / 'model.safetensors'))
            .items()}


def _image(seed: int, shape=(72, 96, 3)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)


def _our_logits(policy, image, instruction) -> torch.Tensor:
    """Full-sequence logits (L, vocab) of our model for the frame's prompt."""
    runner = policy.engine.runner
    embeds = runner.prepare_prompt(Frame(image, instruction), policy.config).embeds
    length = embeds.shape[0]
    hidden = runner.forward(embeds, causal_batch(0, length, runner.device),
                            runner.new_cache(length))
    return runner.lm.logits(hidden), embeds


# ---- Llama vs transformers -------------------------------------------------------------------

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_logits_match_hf_float32(policies, baselines, seed):
    image, instruction = _image(seed), INSTRUCTIONS[seed]
    ours, embeds = _our_logits(policies['float32'], image, instruction)
    theirs = baselines['float32'].logits(embeds)
    assert ours.dtype == theirs.dtype == torch.float32
    scale = theirs.abs().max().item()
    assert (ours - theirs).abs().max().item() <= 1e-5 * scale
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))


@pytest.mark.parametrize('seed', [0, 1, 2, 3])
def test_greedy_tokens_match_hf_float32(policies, baselines, seed):
    image, instruction = _image(10 + seed), INSTRUCTIONS[seed]
    expected = generate_tokens(baselines['float32'], image, instruction)
    result = policies['float32'].predict(image, instruction, UNNORM_KEY)
    assert list(result.tokens) == expected
    assert len(expected) == 7


@pytest.mark.parametrize('seed, instruction', [(s, INSTRUCTIONS[s % 4]) for s in range(6)])
def test_greedy_tokens_identical_float64(policies, baselines, seed, instruction):
    image = _image(20 + seed, shape=(40 + 7 * seed, 90 - 5 * seed, 3))
    expected = generate_tokens(baselines['float64'], image, instruction)
    result = policies['float64'].predict(image, instruction, UNNORM_KEY)
    assert list(result.tokens) == expected


def test_compiled_baseline_static_cache_gives_the_eager_tokens(policies, baselines):
    """The "compiled" HF baseline (one StaticCache reset per frame, generate's compiled
    decode; here through torch.compile's "eager" backend so it runs on a CPU) decodes the
    same tokens as eager HF, frame after frame with prompts of different lengths."""
    policy = policies['float64']
    compiled = HFBaseline(policy.engine.runner, policy.config, variant='compiled',
                          compile_backend='eager')
    assert compiled.label == 'hf_compiled'
    for seed in range(3):
        image, instruction = _image(40 + seed), INSTRUCTIONS[seed]
        assert generate_tokens(compiled, image, instruction) == \
            generate_tokens(baselines['float64'], image, instruction)


def test_baseline_variant_is_checked(policies):
    with pytest.raises(ValueError, match='variant'):
        HFBaseline(policies['float32'].engine.runner, policies['float32'].config,
                   variant='fast')


def _hf_rmsnorm_forward(self, x, kernel=None, quantizer=None):
    # transformers' LlamaRMSNorm arithmetic: normalise in float32, scale in the input dtype
    # (RMSNorm.forward's signature; no FP8 codes in this float64 model).
    assert quantizer is None
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
    return self.weight * h.to(x.dtype)


def test_float64_logits_agree_to_float64_precision(policies, baselines, monkeypatch):
    image, instruction = _image(5), INSTRUCTIONS[1]
    ours, embeds = _our_logits(policies['float64'], image, instruction)
    theirs = baselines['float64'].logits(embeds)
    scale = theirs.abs().max().item()
    # Only HF's float32 RMSNorm separates the two in float64.
    assert (ours - theirs).abs().max().item() <= 1e-5 * scale
    monkeypatch.setattr(layers.RMSNorm, 'forward', _hf_rmsnorm_forward)
    ours_hf_norm, _ = _our_logits(policies['float64'], image, instruction)
    assert (ours_hf_norm - theirs).abs().max().item() <= 1e-12 * scale


# ---- OpenVLA issue #346: the image must matter -----------------------------------------------

def test_black_and_white_images_give_different_logits(policies):
    black = np.zeros((64, 64, 3), dtype=np.uint8)
    white = np.full((64, 64, 3), 255, dtype=np.uint8)
    for policy in policies.values():
        a, _ = _our_logits(policy, black, INSTRUCTIONS[0])
        b, _ = _our_logits(policy, white, INSTRUCTIONS[0])
        scale = a[-1].abs().max().item()
        assert (a[-1] - b[-1]).abs().max().item() > 1e-2 * scale     # next-token logits


def test_black_and_white_images_differ_through_hf(policies, baselines):
    runner = policies['float32'].engine.runner
    out = []
    for value in (0, 255):
        image = np.full((64, 64, 3), value, dtype=np.uint8)
        embeds = runner.prepare_prompt(Frame(image, INSTRUCTIONS[0]), policies['float32']
                                       .config).embeds
        out.append(baselines['float32'].logits(embeds)[-1])
    assert (out[0] - out[1]).abs().max().item() > 1e-2 * out[0].abs().max().item()


# ---- vision towers and projector vs a plain re-computation -----------------------------------

def _layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + LN_EPS) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _block(x, w, p, num_heads, has_layer_scale):
    n, d = x.shape
    hd = d // num_heads
    h = _layer_norm(x, w[p + 'norm1.weight'], w[p + 'norm1.bias'])
    qkv = h @ w[p + 'attn.qkv.weight'].T + w[p + 'attn.qkv.bias']          # (N, 3D)
    q, k, v = qkv.view(n, 3, num_heads, hd).permute(1, 2, 0, 3)            # (heads, N, hd)
    att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd), dim=-1)
    a = (att @ v).transpose(0, 1).reshape(n, d)
    a = a @ w[p + 'attn.proj.weight'].T + w[p + 'attn.proj.bias']
    x = x + (a * w[p + 'ls1.scale_factor'] if has_layer_scale else a)
    h = _layer_norm(x, w[p + 'norm2.weight'], w[p + 'norm2.bias'])
    m = _gelu(h @ w[p + 'mlp.fc1.weight'].T + w[p + 'mlp.fc1.bias'])
    m = m @ w[p + 'mlp.fc2.weight'].T + w[p + 'mlp.fc2.bias']
    return x + (m * w[p + 'ls2.scale_factor'] if has_layer_scale else m)


def _tower(pixels, w, prefix, tower, num_blocks, final_norm=False):
    """pixels (3, S, S) -> (num_patches, D): run ``num_blocks`` blocks, drop CLS/registers."""
    x = F.conv2d(pixels[None], w[prefix + 'patch_embed.proj.weight'],
                 w[prefix + 'patch_embed.proj.bias'], stride=tower.patch_size)
    x = x[0].flatten(1).T + w[prefix + 'pos_embed'][0]                    # (P, D)
    num_prefix = 0
    if tower.kind == 'dinov2':
        tokens = [w[prefix + 'cls_token'][0], w[prefix + 'reg_token'][0]]
        num_prefix = sum(t.shape[0] for t in tokens)
        x = torch.cat(tokens + [x], dim=0)
    for i in range(num_blocks):
        x = _block(x, w, f'{prefix}blocks.{i}.', tower.num_heads, tower.kind == 'dinov2')
    if final_norm:
        x = _layer_norm(x, w[prefix + 'norm.weight'], w[prefix + 'norm.bias'])
    return x[num_prefix:]


def _manual_patches(pixels, w, cfg, blocks_from_end=2, final_norm=False):
    dino = _tower(pixels[:3], w, 'vision_backbone.featurizer.', cfg.featurizer,
                  cfg.featurizer.depth - blocks_from_end + 1, final_norm)
    sig = _tower(pixels[3:], w, 'vision_backbone.fused_featurizer.', cfg.fused_featurizer,
                 cfg.fused_featurizer.depth - blocks_from_end + 1, final_norm)
    return torch.cat([dino, sig], dim=-1)


def _manual_projector(x, w):
    h = _gelu(x @ w['projector.fc1.weight'].T + w['projector.fc1.bias'])
    h = _gelu(h @ w['projector.fc2.weight'].T + w['projector.fc2.bias'])
    return h @ w['projector.fc3.weight'].T + w['projector.fc3.bias']


@pytest.mark.parametrize('size', [(64, 64), (70, 53)])
def test_patch_embedding_is_the_strided_convolution(size):
    """The patch projection as one product over the cut-up image equals timm's strided
    convolution, including the pixels dropped beyond the last whole patch."""
    from vla_spec_ros.config import VisionTowerConfig
    from vla_spec_ros.models.openvla.vision import PatchEmbed
    torch.manual_seed(0)
    cfg = VisionTowerConfig(kind='siglip', image_size=64, patch_size=16, embed_dim=24,
                            depth=2, num_heads=2, mlp_dim=48)
    embed = PatchEmbed(cfg).double()
    pixels = torch.randn(2, 3, *size, dtype=torch.float64)
    expected = F.conv2d(pixels, embed.proj.weight, embed.proj.bias, stride=16)
    expected = expected.flatten(2).transpose(1, 2)                     # (B, P, D)
    got = embed(pixels)
    assert got.shape == expected.shape == (2, (size[0] // 16) * (size[1] // 16), 24)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_vision_backbone_is_second_to_last_block_without_prefix(policies, raw_weights):
    policy = policies['float64']
    cfg = policy.model_config
    pixels = preprocess_image(_image(30), cfg, dtype=torch.float64)
    with torch.no_grad():
        ours = policy.engine.runner.model.vision_backbone(pixels[None])[0]
    assert ours.shape == (cfg.num_patches, cfg.featurizer.embed_dim
                          + cfg.fused_featurizer.embed_dim)
    expected = _manual_patches(pixels, raw_weights, cfg)
    torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-10)
    # The check can tell blocks apart: the last block + final norm give something else.
    last = _manual_patches(pixels, raw_weights, cfg, blocks_from_end=1, final_norm=True)
    assert (last - ours).abs().max().item() > 1e-3


def test_prompt_layout_bos_patches_text(policies, baselines, raw_weights):
    policy = policies['float64']
    runner, cfg = policy.engine.runner, policy.model_config
    image, instruction = _image(31), INSTRUCTIONS[2]
    ids = runner.tokenizer.encode(instruction)
    assert ids[0] == 1
    prompt = runner.prepare_prompt(Frame(image, instruction), policy.config)
    assert prompt.input_ids == ids
    pixels = preprocess_image(image, cfg, dtype=torch.float64)
    patches = _manual_projector(_manual_patches(pixels, raw_weights, cfg), raw_weights)
    table = raw_weights['language_model.model.embed_tokens.weight']
    expected = torch.cat([table[ids[:1]], patches, table[ids[1:]]], dim=0)
    assert prompt.embeds.shape == (len(ids) + cfg.num_patches, cfg.llm.hidden_size)
    torch.testing.assert_close(prompt.embeds, expected, rtol=1e-10, atol=1e-10)
    # The whole chain re-built by hand, fed to HF's Llama, predicts the AR reference's first
    # token.
    first = int(baselines['float64'].logits(expected)[-1].argmax())
    assert policy.predict(image, instruction, UNNORM_KEY).tokens[0] == first
