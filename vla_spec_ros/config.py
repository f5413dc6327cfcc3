"""Model presets and engine options as frozen, validated dataclasses.

Every field is checked at construction; bad values raise ``ValueError`` naming the field, and
unknown keys fail loudly (``from_dict``). Values computed at run time (sequence lengths, ring
sizes) live in plan objects elsewhere, never written back onto a config.

Dimensions of the ``openvla-7b`` preset follow reference/openvla.md §1 (DINOv2-L/14 with 4
registers + SigLIP So400m/14 at 224 px, fused-GELU-MLP projector, Llama-2-7B with vocab 32064).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

# OpenVLA's image normalisation, as serialised in bf16 (reference/openvla.md §3).
DINOV2_MEAN = (0.484375, 0.455078125, 0.40625)
DINOV2_STD = (0.228515625, 0.2236328125, 0.224609375)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


def _require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f'{name}: {message}')


def require_int_fields(obj, names, minimum: int) -> None:
    """ValueError naming the first field of ``obj`` in ``names`` that is not an int >= minimum
    (bools refused)."""
    for name in names:
        value = getattr(obj, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ValueError(f'{name}: must be an integer >= {minimum}, got {value!r}')


def _check_fields(cls, data: Mapping[str, Any]) -> None:
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f'{cls.__name__}: unknown keys {unknown}; known keys are {sorted(known)}')


@dataclass(frozen=True)
class VisionTowerConfig:
    """One ViT tower. OpenVLA uses the output of the second-to-last block, no final norm."""

    kind: str                     # "dinov2" (CLS + registers, LayerScale) or "siglip"
    image_size: int
    patch_size: int
    embed_dim: int
    depth: int                    # blocks in the checkpoint; the last one is unused
    num_heads: int
    mlp_dim: int
    num_register_tokens: int = 0
    norm_eps: float = 1e-6
    mean: tuple = DINOV2_MEAN
    std: tuple = DINOV2_STD

    def __post_init__(self):
        _require(self.kind in ('dinov2', 'siglip'), 'kind', f'{self.kind!r} not in dinov2/siglip')
        for name in ('image_size', 'patch_size', 'embed_dim', 'depth', 'num_heads', 'mlp_dim'):
            _require(int(getattr(self, name)) > 0, name, 'must be > 0')
        _require(self.depth >= 2, 'depth', 'needs >= 2 blocks (OpenVLA reads block depth-2)')
        _require(self.image_size % self.patch_size == 0, 'image_size',
                 'must be a multiple of patch_size')
        _require(self.embed_dim % self.num_heads == 0, 'embed_dim',
                 'must be divisible by num_heads')
        _require(self.num_register_tokens >= 0, 'num_register_tokens', 'must be >= 0')
        _require(self.kind == 'dinov2' or self.num_register_tokens == 0, 'num_register_tokens',
                 'only dinov2 towers carry register tokens')
        _require(len(self.mean) == 3 and len(self.std) == 3, 'mean/std', 'need 3 channels')
        object.__setattr__(self, 'mean', tuple(float(x) for x in self.mean))
        object.__setattr__(self, 'std', tuple(float(x) for x in self.std))

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_prefix_tokens(self) -> int:
        """CLS + registers for DINOv2 (dropped from the output), none for SigLIP."""
        return 1 + self.num_register_tokens if self.kind == 'dinov2' else 0


@dataclass(frozen=True)
class LlamaConfig:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    num_kv_heads: int = 0          # 0 means num_heads (no GQA)
    rms_norm_eps: float = 1e-6     # transformers' LlamaConfig default; see openvla.md §1.3
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048

    def __post_init__(self):
        if self.num_kv_heads == 0:
            object.__setattr__(self, 'num_kv_heads', self.num_heads)
        for name in ('hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                     'vocab_size', 'max_position_embeddings'):
            _require(int(getattr(self, name)) > 0, name, 'must be > 0')
        _require(self.hidden_size % self.num_heads == 0, 'hidden_size',
                 'must be divisible by num_heads')
        _require(self.num_heads % self.num_kv_heads == 0, 'num_kv_heads',
                 'must divide num_heads')
        _require((self.hidden_size // self.num_heads) % 2 == 0, 'hidden_size',
                 'head dim must be even for RoPE')
        _require(self.rms_norm_eps > 0, 'rms_norm_eps', 'must be > 0')
        _require(self.rope_theta > 0, 'rope_theta', 'must be > 0')

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


@dataclass(frozen=True)
class VLAConfig:
    """An OpenVLA-architecture model: fused DINOv2+SigLIP → 3-layer GELU MLP → Llama."""

    featurizer: VisionTowerConfig
    fused_featurizer: VisionTowerConfig
    llm: LlamaConfig
    n_action_bins: int = 256
    pad_to_multiple_of: int = 64
    pad_token_id: int = 32000
    action_dim: int = 7

    def __post_init__(self):
        f, g = self.featurizer, self.fused_featurizer
        _require(f.kind == 'dinov2', 'featurizer.kind', 'OpenVLA fuses DINOv2 first')
        _require(g.kind == 'siglip', 'fused_featurizer.kind', 'OpenVLA fuses SigLIP second')
        _require(f.image_size == g.image_size and f.patch_size == g.patch_size,
                 'fused_featurizer', 'both towers must see the same image and patch sizes')
        _require(self.n_action_bins >= 2, 'n_action_bins', 'must be >= 2')
        _require(self.pad_to_multiple_of >= 0, 'pad_to_multiple_of', 'must be >= 0')
        _require(self.action_dim > 0, 'action_dim', 'must be > 0')
        _require(self.text_vocab_size - self.n_action_bins >= 3, 'llm.vocab_size',
                 f'vocab_size - pad_to_multiple_of = {self.text_vocab_size} leaves no room for '
                 f'{self.n_action_bins} action bins plus special tokens')

    @property
    def image_size(self) -> int:
        return self.featurizer.image_size

    @property
    def num_patches(self) -> int:
        return self.featurizer.num_patches

    @property
    def vision_dim(self) -> int:
        return self.featurizer.embed_dim + self.fused_featurizer.embed_dim

    @property
    def text_vocab_size(self) -> int:
        """OpenVLA's V: action token ids are V-1 (bin 0) down to V-n_action_bins."""
        return self.llm.vocab_size - self.pad_to_multiple_of


def _openvla_7b() -> VLAConfig:
    return VLAConfig(
        featurizer=VisionTowerConfig('dinov2', 224, 14, 1024, 24, 16, 4096,
                                     num_register_tokens=4, mean=DINOV2_MEAN, std=DINOV2_STD),
        fused_featurizer=VisionTowerConfig('siglip', 224, 14, 1152, 27, 16, 4304,
                                           mean=SIGLIP_MEAN, std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=11008,
                        vocab_size=32064),
        pad_token_id=32000,
    )


def _tiny() -> VLAConfig:
    """Same structure, small dims: a few MB, for tests. Tokenizer vocab 1024 (+<PAD>)."""
    return VLAConfig(
        featurizer=VisionTowerConfig('dinov2', 56, 14, 32, 3, 2, 64, num_register_tokens=4,
                                     mean=DINOV2_MEAN, std=DINOV2_STD),
        fused_featurizer=VisionTowerConfig('siglip', 56, 14, 48, 3, 2, 96,
                                           mean=SIGLIP_MEAN, std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=160,
                        vocab_size=1088, max_position_embeddings=512),
        pad_token_id=1024,
    )


def _metaworld_demo() -> VLAConfig:
    """The embedded default model's architecture (issue 6): 64 x 64 images in 16-pixel patches
    (16 patches), two 3-block 96-wide towers, a 4-layer 128-wide Llama; a 512-id tokenizer
    learned from the Meta-World instructions whose last 256 ids are the action bins. Sized to
    train on a 2-core CPU in about an hour (8-pixel patches cost 4.6x more per step there) and
    to run well above 10 actions/s on it in AR mode."""
    return VLAConfig(
        featurizer=VisionTowerConfig('dinov2', 64, 16, 96, 3, 2, 384, num_register_tokens=4,
                                     mean=DINOV2_MEAN, std=DINOV2_STD),
        fused_featurizer=VisionTowerConfig('siglip', 64, 16, 96, 3, 2, 384,
                                           mean=SIGLIP_MEAN, std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=344,
                        vocab_size=576, max_position_embeddings=512),
        pad_token_id=512,
    )


PRESETS = {
    'openvla-7b': _openvla_7b,
    'tiny': _tiny,
    'metaworld-demo': _metaworld_demo,
}


def preset(name: str) -> VLAConfig:
    if name not in PRESETS:
        raise ValueError(f'unknown preset {name!r}; available presets: {sorted(PRESETS)}')
    return PRESETS[name]()


MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')
DTYPES = ('float32', 'float64', 'bfloat16', 'float16')
ATTENTION_BACKENDS = ('auto', 'segments', 'dense')

# Options that may change between frames without reloading (ROS `param set` tunables).
TUNABLE_ENGINE_FIELDS = ('relax_threshold', 'tree_depth', 'tree_top_k', 'tree_max_nodes')


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a loaded model. `mode` picks the decoding strategy."""

    mode: str = 'ar'
    device: str = 'cpu'
    dtype: str = 'float32'
    # Greedy over the whole vocabulary is the reference (S1); this option restricts argmax to
    # the action tokens. Off by default for parity with OpenVLA.
    restrict_to_action_tokens: bool = False
    # Preprocessing (reference/openvla.md §3): checkpoints trained with crop augmentation need
    # center_crop; LIBERO evaluation rotates the agent-view image by 180 degrees.
    center_crop: bool = False
    rotate_180: bool = False
    # Speculative decoding (Spec-VLA defaults: 50 nodes incl. root / depth 4 / top-k 8).
    draft_path: str | None = None
    relax_threshold: int = 0
    tree_depth: int = 4
    tree_top_k: int = 8
    tree_max_nodes: int = 50
    # Pipelining: requests in flight at once (1 = plain AR latency).
    max_inflight: int = 7
    # Streams (camera / robots) one engine may serve at once.
    max_streams: int = 4
    # Fused Triton kernels: "auto" uses them on CUDA when triton imports, never on CPU.
    use_kernels: str = 'auto'
    # Attention over the packed ring: "segments" (each request attends to its own KV span and
    # tree only: cost proportional to the work in flight), "dense" (the reference: one
    # T x ring mask, cost grows with the whole ring), "auto" = segments.
    attention_backend: str = 'auto'
    # CUDA graphs of the packed verifier step, the draft forwards and the vision towers
    # (captured per shape bucket on first use, replayed after). CUDA only.
    use_cuda_graphs: bool = False
    max_instruction_tokens: int = 128
    seed: int = 0

    def __post_init__(self):
        _require(self.mode in MODES, 'mode', f'{self.mode!r} not in {MODES}')
        _require(self.dtype in DTYPES, 'dtype', f'{self.dtype!r} not in {DTYPES}')
        _require(isinstance(self.device, str) and (self.device == 'cpu'
                                                   or self.device.startswith('cuda')),
                 'device', f'{self.device!r}: expected "cpu" or "cuda[:N]"')
        _require(isinstance(self.relax_threshold, int) and 0 <= self.relax_threshold <= 255,
                 'relax_threshold', 'must be an integer in [0, 255] bins')
        _require(isinstance(self.tree_depth, int) and 1 <= self.tree_depth <= 16,
                 'tree_depth', 'must be an integer in [1, 16]')
        _require(isinstance(self.tree_top_k, int) and 1 <= self.tree_top_k <= 32,
                 'tree_top_k', 'must be an integer in [1, 32]')
        _require(isinstance(self.tree_max_nodes, int) and 2 <= self.tree_max_nodes <= 512,
                 'tree_max_nodes', 'must be an integer in [2, 512] (root included)')
        _require(isinstance(self.max_inflight, int) and 1 <= self.max_inflight <= 64,
                 'max_inflight', 'must be an integer in [1, 64]')
        _require(isinstance(self.max_streams, int) and 1 <= self.max_streams <= 64,
                 'max_streams', 'must be an integer in [1, 64]')
        _require(self.attention_backend in ATTENTION_BACKENDS, 'attention_backend',
                 f'{self.attention_backend!r} not in {ATTENTION_BACKENDS} ("sdpa" and "flex" '
                 'were replaced by "segments", the work-proportional path, and "dense", the '
                 'reference)')
        _require(isinstance(self.use_cuda_graphs, bool), 'use_cuda_graphs', 'must be a bool')
        _require(not self.use_cuda_graphs or self.device.startswith('cuda'), 'use_cuda_graphs',
                 f'CUDA graphs need device "cuda", got {self.device!r}')
        _require(not (self.use_cuda_graphs and self.attention_backend == 'dense'),
                 'use_cuda_graphs', 'the dense reference attention is never graphed; use '
                 'attention_backend "segments" or "auto"')
        _require(self.use_kernels in ('auto', 'on', 'off'), 'use_kernels',
                 'must be "auto", "on" or "off"')
        _require(isinstance(self.max_instruction_tokens, int)
                 and 1 <= self.max_instruction_tokens <= 1024,
                 'max_instruction_tokens', 'must be an integer in [1, 1024]')

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> 'EngineConfig':
        _check_fields(cls, data)
        return cls(**dict(data))

    def replace(self, **changes) -> 'EngineConfig':
        _check_fields(type(self), changes)
        return dataclasses.replace(self, **changes)

    @property
    def is_speculative(self) -> bool:
        return self.mode in ('spec', 'pipeline_spec')

    @property
    def is_pipelined(self) -> bool:
        return self.mode in ('pipeline', 'pipeline_spec')


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


__all__ = ['VisionTowerConfig', 'LlamaConfig', 'VLAConfig', 'EngineConfig', 'PRESETS', 'preset',
           'MODES', 'DTYPES', 'TUNABLE_ENGINE_FIELDS']
