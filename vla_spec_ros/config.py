"""The generic configuration: the parts of a model every family builds from (a vision tower, a
RoPE decoder) and the engine's options, as frozen, validated dataclasses.

Every field is checked at construction; bad values raise ``ValueError`` naming the field, and
unknown keys fail loudly (``from_dict``). Values computed at run time (sequence lengths, ring
sizes) live in plan objects elsewhere, never written back onto a config. A family's own config
class and its presets live in its folder (``models/<family>/config.py``); ``models/registry``
looks a preset up by name.
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from typing import Any, Mapping

from vla_spec_ros.validation import check_int, check_number

# OpenVLA's image normalisation, as serialised in bf16 (docs/openvla.md, Image preprocessing).
DINOV2_MEAN = (0.484375, 0.455078125, 0.40625)
DINOV2_STD = (0.228515625, 0.2236328125, 0.224609375)
SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)


def require(condition: bool, name: str, message: str) -> None:
    """ValueError ``'<name>: <message>'`` unless ``condition`` (every config's field check)."""
    if not condition:
        raise ValueError(f'{name}: {message}')


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
        require(self.kind in ('dinov2', 'siglip'), 'kind', f'{self.kind!r} not in dinov2/siglip')
        # Integers, not merely integral: a config.json's 16.0 would reach the patch convolution
        # and the position table as a float (a TypeError deep in the model).
        for name in ('image_size', 'patch_size', 'embed_dim', 'depth', 'num_heads', 'mlp_dim'):
            check_int(name, getattr(self, name), minimum=1)
        check_int('num_register_tokens', self.num_register_tokens, minimum=0)
        object.__setattr__(self, 'norm_eps', check_number('norm_eps', self.norm_eps, above=0))
        require(self.depth >= 2, 'depth', 'needs >= 2 blocks (OpenVLA reads block depth-2)')
        # Pixels beyond the last whole patch are dropped, as timm's strided convolution drops
        # them (SigLIP So400m/14 at 384 px sees 27 x 27 patches of 14).
        require(self.image_size >= self.patch_size, 'image_size',
                f'{self.image_size} is smaller than patch_size {self.patch_size}')
        require(self.embed_dim % self.num_heads == 0, 'embed_dim',
                'must be divisible by num_heads')
        require(self.kind == 'dinov2' or self.num_register_tokens == 0, 'num_register_tokens',
                'only dinov2 towers carry register tokens')
        require(len(self.mean) == 3 and len(self.std) == 3, 'mean/std', 'need 3 channels')
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
    """A pre-norm RoPE decoder: Llama's by default, Gemma's with the options below.

    The attention shape is explicit: ``num_kv_heads`` (1 = multi-query, Gemma-2B; 0 means
    ``num_heads``, no grouping) and ``head_dim`` (0 means ``hidden_size // num_heads``; Gemma-2B
    has 8 heads of 256 in a 2048 width). The KV cache, the ring and the kernels read these, never
    ``hidden_size / num_heads``.

    Gemma's differences, as options (transformers' ``GemmaModel``): ``norm_unit_offset``
    (RMSNorm scales by ``1 + w``, computed in float32 or wider), ``hidden_act`` ``gelu_tanh``
    (GeGLU with the tanh-approximated GELU instead of SwiGLU), ``embed_scale`` (token
    embeddings times sqrt(hidden_size), image features not) and ``tie_word_embeddings`` (the
    LM head is the embedding table).
    """

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    num_kv_heads: int = 0          # 0 means num_heads (no GQA)
    rms_norm_eps: float = 1e-6     # transformers' LlamaConfig default; see openvla.md §1.3
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    head_dim: int = 0              # 0 means hidden_size // num_heads
    norm_unit_offset: bool = False
    hidden_act: str = 'silu'
    embed_scale: bool = False
    tie_word_embeddings: bool = False

    def __post_init__(self):
        if self.num_kv_heads == 0:
            object.__setattr__(self, 'num_kv_heads', self.num_heads)
        for name in ('hidden_size', 'num_layers', 'num_heads', 'intermediate_size',
                     'vocab_size', 'max_position_embeddings'):
            require(int(getattr(self, name)) > 0, name, 'must be > 0')
        require(self.head_dim >= 0, 'head_dim', 'must be >= 0 (0: hidden_size // num_heads)')
        if self.head_dim == 0:
            require(self.hidden_size % self.num_heads == 0, 'hidden_size',
                    'must be divisible by num_heads (or give head_dim)')
            object.__setattr__(self, 'head_dim', self.hidden_size // self.num_heads)
        require(self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads == 0,
                'num_kv_heads', 'must divide num_heads')
        require(self.head_dim % 2 == 0, 'head_dim', 'must be even for RoPE')
        require(self.rms_norm_eps > 0, 'rms_norm_eps', 'must be > 0')
        require(self.rope_theta > 0, 'rope_theta', 'must be > 0')
        require(self.hidden_act in HIDDEN_ACTS, 'hidden_act',
                f'{self.hidden_act!r} not in {HIDDEN_ACTS}')

    @property
    def embedding_multiplier(self) -> float | None:
        """What token embeddings are multiplied by (None: nothing). Gemma's sqrt(hidden_size)
        rounded to float32, as transformers stores it (a float32 buffer cast to the weights'
        dtype), so float64 runs match its arithmetic bit for bit."""
        if not self.embed_scale:
            return None
        return float(struct.unpack('f', struct.pack('f', self.hidden_size ** 0.5))[0])


# MLP activations of the decoder: SwiGLU (Llama) and GeGLU with tanh GELU (Gemma).
HIDDEN_ACTS = ('silu', 'gelu_tanh')


def dinov2_vit_l(image_size: int = 224) -> VisionTowerConfig:
    """DINOv2-L/14 with 4 registers (timm ``vit_large_patch14_reg4_dinov2.lvd142m``)."""
    return VisionTowerConfig('dinov2', image_size, 14, 1024, 24, 16, 4096,
                             num_register_tokens=4, mean=DINOV2_MEAN, std=DINOV2_STD)


def siglip_so400m(image_size: int = 224) -> VisionTowerConfig:
    """SigLIP So400m/14 (timm ``vit_so400m_patch14_siglip_224`` / ``_384``)."""
    return VisionTowerConfig('siglip', image_size, 14, 1152, 27, 16, 4304,
                             mean=SIGLIP_MEAN, std=SIGLIP_STD)


MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')
DTYPES = ('float32', 'float64', 'bfloat16', 'float16')
ATTENTION_BACKENDS = ('auto', 'segments', 'ring', 'dense')
KERNEL_CHOICES = ('auto', 'on', 'off')


@dataclass(frozen=True)
class EngineOption:
    """What one EngineConfig field means and accepts: the single source for its validation,
    its ROS parameter (ros/param_table.py derives the declaration from this) and its docs."""

    description: str
    is_tunable: bool = False           # may change between frames without reloading
    minimum: float | None = None       # inclusive range (integers for int fields)
    maximum: float | None = None
    choices: tuple = ()
    unit: str = ''
    not_a_parameter: str = ''          # why the node does not expose it ('' = it does)


# pipeline_spec's frames of one stream in flight when max_inflight_per_stream is 0 (measured:
# docs/engine.md, "Frames of one robot in flight").
PIPELINE_SPEC_FRAMES_PER_STREAM = 1


def _option(default, description: str, **kwargs):
    return dataclasses.field(default=default,
                             metadata={'option': EngineOption(description, **kwargs)})


def engine_option(field_name: str) -> EngineOption:
    """The EngineOption of an EngineConfig field (KeyError for an unknown name)."""
    return {f.name: f.metadata['option'] for f in dataclasses.fields(EngineConfig)}[field_name]


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a loaded model. `mode` picks the decoding strategy.

    Each field carries its EngineOption (range, choices, tunable, description); __post_init__
    checks them all, then the rules that tie fields together.
    """

    # The default is the fastest exact configuration measured on the node (README): pipelined
    # speculation drafting each stream's previous action (no draft model, r = 0: AR's tokens).
    mode: str = _option('pipeline_spec', 'Decoding mode', choices=MODES)
    device: str = _option('cpu', 'Torch device: cpu or cuda[:N]')
    dtype: str = _option('float32', 'Model weights and activations dtype', choices=DTYPES)
    # FP8 weights (models/fp8.py): e4m3 with per-output-channel scales for the decoder's
    # q/k/v/o and gate/up/down projections, torch._scaled_mm on CUDA (sm_89+, dtype bfloat16),
    # the dequantised reference on a CPU (tests and fidelity, not speed).
    weight_dtype: str = _option('auto', 'Decoder projection weights: auto (= dtype) or fp8 '
                                '(e4m3, one scale per output channel; CUDA: sm_89+ and dtype '
                                'bfloat16)', choices=('auto', 'fp8'))
    # Greedy over the whole vocabulary is the reference (S1); this option restricts argmax to
    # the action tokens. Off by default for parity with OpenVLA.
    restrict_to_action_tokens: bool = _option(
        False, 'Greedy argmax over action tokens only (off = OpenVLA parity)')
    # Preprocessing (docs/architecture.md, "one frame"): checkpoints trained with crop
    # augmentation need center_crop; LIBERO evaluation rotates the agent-view image by 180°.
    center_crop: bool = _option(False, 'Center-crop (scale 0.9) before resizing; for '
                                'checkpoints trained with crop augmentation')
    rotate_180: bool = _option(False, 'Rotate the image by 180 degrees first (LIBERO agent '
                               'view)')
    # Speculative decoding (Spec-VLA defaults: 50 nodes incl. root / depth 4 / top-k 8).
    draft_path: str | None = _option(None, 'Drafter of the spec modes: "previous_action" (each '
                                     'stream\'s previous action, no draft model), an EAGLE '
                                     'draft-head folder, "checkpoint" (the checkpoint\'s '
                                     'draft/ folder) or "random" (a seeded random head, for '
                                     'tests); empty = the model\'s default draft '
                                     '(previous_action, or the one its family names)')
    draft_previous_action: bool = _option(False, 'Also draft each stream\'s previous action: its '
                                          'chain is merged into every draft-head tree (spec '
                                          'modes)')
    # Speculative prefill: a drafter whose draft needs no verifier features (the previous
    # action) puts a new frame's draft after its prompt, and the prefill forward verifies it.
    speculative_prefill: bool = _option(True, 'Spec modes: verify a draft that needs no '
                                        'verifier features (the previous action) inside the '
                                        'forward that prefills the frame')
    relax_threshold: int = _option(0, 'Relaxed acceptance: accept a draft bin within this many '
                                   'bins of the verifier (0 = exact)', is_tunable=True,
                                   minimum=0, maximum=255, unit='bins')
    tree_depth: int = _option(4, 'Draft tree depth (draft heads; the previous action\'s chain '
                              'derives its own)', is_tunable=True, minimum=1, maximum=16)
    tree_top_k: int = _option(8, 'Draft tree top-k per expanded node', is_tunable=True,
                              minimum=1, maximum=32)
    tree_max_nodes: int = _option(50, 'Draft tree size, root included', is_tunable=True,
                                  minimum=2, maximum=512)
    # Confidence pruning (not in Spec-VLA; docs/speculation.md): 0 = EAGLE-2's tree exactly.
    tree_min_prob: float = _option(0.0, 'Draft tree pruning: a draft candidate whose cumulative '
                                   'draft probability is below this is neither expanded nor '
                                   'verified (0 = off)', is_tunable=True, minimum=0.0,
                                   maximum=1.0)
    # Pipelining: requests in flight at once (1 = plain AR latency).
    max_inflight: int = _option(7, 'Requests in flight at once in the pipeline modes',
                                minimum=1, maximum=64)
    # One stream's frames in flight at once (0: the mode's own, `stream_inflight_limit`). In
    # pipeline_spec a robot's frame finishes in a few forwards; a second frame of the same
    # robot packed beside it makes every one of those forwards dearer and drafts from an
    # older action, so the frames whose drafts miss (the p99) get slower than AR's: one robot
    # is answered as often at 1 as at 2, with a lower p99 (docs/engine.md, "Frames of one
    # robot in flight"). Several robots still share every step. Plain pipeline needs
    # action_dim frames of a robot in flight to answer one per step, so it keeps max_inflight.
    max_inflight_per_stream: int = _option(0, 'Frames of one stream (robot) in flight at once '
                                           'in the pipeline modes; 0 = the mode\'s own: 1 in '
                                           'pipeline_spec, max_inflight in pipeline',
                                           minimum=0, maximum=64)
    # Several streams: waiting frames admitted together (their prefills share one step).
    max_prefills_per_step: int = _option(1, 'Waiting frames prefilled together in one step in '
                                         'the pipeline modes (the node keeps one waiting frame '
                                         'per robot: several need several robots)', minimum=1,
                                         maximum=4)
    # Streams (cameras / robots) one engine may serve at once.
    max_streams: int = _option(4, 'Streams (robots) one engine serves at once', minimum=1,
                               maximum=64, not_a_parameter='the node sets it to the number '
                               'of robots it serves')
    # Fused Triton kernels: "auto" uses them on CUDA when triton imports, never on CPU.
    use_kernels: str = _option('auto', 'Fused Triton kernels: auto (CUDA only), on or off',
                               choices=KERNEL_CHOICES)
    # Attention over the packed ring: "segments" (each request attends to its own KV span and
    # tree only, gathered then SDPA: cost proportional to the work in flight), "ring" (the
    # same through one Triton kernel per layer reading the slots in place: CUDA, or the
    # interpreter on a CPU; not the default until timed on a GPU), "dense" (the reference: one
    # T x ring mask, cost grows with the whole ring), "auto" = segments.
    attention_backend: str = _option('auto', 'Packed attention: auto (= segments: each request '
                                     'attends to its own KV only), ring (segments read in '
                                     'place by a Triton kernel) or dense (the reference)',
                                     choices=ATTENTION_BACKENDS)
    # CUDA graphs of the packed verifier step and the vision towers (captured per shape
    # bucket before first use, replayed after) and of the draft forwards (padded shape
    # buckets, captured on first use). CUDA only.
    use_cuda_graphs: bool = _option(False, 'CUDA graphs of the packed step, the vision towers '
                                    'and the draft forwards (device cuda only)')
    max_instruction_tokens: int = _option(128, 'Longest accepted instruction, in tokens',
                                          minimum=1, maximum=1024)
    # A reasoning policy (ECoT) writes text before its action: the KV ring, the draft lanes
    # and the position check are sized by this budget (codecs/reasoning.py).
    max_reasoning_tokens: int = _option(0, 'Reasoning policies (ECoT): most tokens of text '
                                        'before the action; a frame without an action within '
                                        'them is refused (0 = the checkpoint\'s own budget; '
                                        'refused for a model that writes no reasoning)',
                                        minimum=0, maximum=4096, unit='tokens')
    # Reasoning policies: write a fresh reasoning every N-th frame of a robot and reuse the
    # last one on the others (Fast-ECoT's lossy cache): the reused text is taken as decided,
    # unverified, and only the action is decoded after it (engine/reasoning_reuse.py).
    reasoning_every_n: int = _option(1, 'Reasoning policies (ECoT): reason afresh on every '
                                     'N-th frame of a robot and reuse its last reasoning on '
                                     'the others, unverified (lossy; 1 = every frame, exact)',
                                     is_tunable=True, minimum=1, maximum=1000, unit='frames')
    seed: int = _option(0, 'Seed for anything random in the engine', minimum=0,
                        maximum=2 ** 31 - 1)

    def __post_init__(self):
        # 1. Each field on its own, from its EngineOption.
        for f in dataclasses.fields(self):
            option, value = f.metadata['option'], getattr(self, f.name)
            if option.choices:
                require(value in option.choices, f.name, f'{value!r} not in {option.choices}'
                        + (' ("sdpa" and "flex" were replaced by "segments", the '
                            'work-proportional path, and "dense", the reference)'
                            if f.name == 'attention_backend' else ''))
            elif isinstance(f.default, bool):
                require(isinstance(value, bool), f.name, f'must be a bool, got {value!r}')
            elif isinstance(f.default, int):
                check_int(f.name, value, minimum=option.minimum, maximum=option.maximum,
                          unit=option.unit)
            elif isinstance(f.default, float):     # an int (YAML's 0) is kept as its float
                object.__setattr__(self, f.name, check_number(
                    f.name, value, minimum=option.minimum, maximum=option.maximum,
                    unit=option.unit))
        require(isinstance(self.device, str) and (self.device == 'cpu'
                or self.device.startswith('cuda')),
                'device', f'{self.device!r}: expected "cpu" or "cuda[:N]"')
        require(self.draft_path is None or isinstance(self.draft_path, str), 'draft_path',
                f'expected a folder path, "random", "previous_action" or None, got '
                f'{self.draft_path!r}')
        # 2. Rules between fields.
        require(not self.use_cuda_graphs or self.device.startswith('cuda'), 'use_cuda_graphs',
                f'CUDA graphs need device "cuda", got {self.device!r}')
        require(not self.is_pipelined or self.max_prefills_per_step <= self.max_inflight,
                'max_prefills_per_step',
                f'{self.max_prefills_per_step} exceeds max_inflight {self.max_inflight} (a '
                'prefilled frame is in flight)')
        drafts_previous_action = self.draft_previous_action or \
            self.draft_path in (None, 'previous_action')
        require(not (self.is_speculative and drafts_previous_action
                     and self.relax_threshold > MAX_RELAX_WITH_PREVIOUS_ACTION),
                'relax_threshold', f'{self.relax_threshold} bins while drafting the previous '
                'action: a bin within r of the verifier\'s is kept, so the robot would hold '
                'its previous action\'s bins until the policy moves more than r bins away '
                '(closed-loop success fell to 0.72 at 32 bins and 0 at 255 on the embedded '
                f'model, docs/speculation.md); at most {MAX_RELAX_WITH_PREVIOUS_ACTION} with '
                'temporal drafting')
        require(not (self.draft_previous_action
                     and self.draft_path in (None, 'previous_action')),
                'draft_previous_action', 'draft_path "previous_action" (the default) already '
                'drafts the previous action alone; draft_previous_action merges it into a '
                'draft head\'s trees: set draft_path to a draft folder or "checkpoint"')
        require(not (self.use_cuda_graphs and self.attention_backend == 'dense'),
                'use_cuda_graphs', 'the dense reference attention is never graphed; use '
                'attention_backend "segments" or "auto"')

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

    @property
    def num_inflight(self) -> int:
        """Requests in flight at once in this mode: max_inflight when pipelined, else 1 (the
        ring, the draft lanes and the node's warm-up are sized by it)."""
        return self.max_inflight if self.is_pipelined else 1

    @property
    def stream_inflight_limit(self) -> int:
        """Frames of one stream in flight at once: max_inflight_per_stream, or with 0 the
        mode's own (1 in pipeline_spec, else num_inflight), never above num_inflight."""
        limit = self.max_inflight_per_stream or (
            PIPELINE_SPEC_FRAMES_PER_STREAM if self.mode == 'pipeline_spec'
            else self.num_inflight)
        return min(limit, self.num_inflight)

    @property
    def num_prefills_per_step(self) -> int:
        """Frames one step may admit in this mode: max_prefills_per_step when pipelined."""
        return self.max_prefills_per_step if self.is_pipelined else 1


# Options that may change between frames without reloading (ROS `param set` tunables).
# Relaxed acceptance against the previous action is hysteresis: the robot keeps its previous
# bin while the policy's stays within r. The largest r at which the embedded model's closed
# loop kept every episode (bench/results/demo/relax-previous-action-20261123: 1.00 up to 8
# bins, 0.72 at 32, 0.00 at 255).
MAX_RELAX_WITH_PREVIOUS_ACTION = 8

TUNABLE_ENGINE_FIELDS = tuple(f.name for f in dataclasses.fields(EngineConfig)
                              if f.metadata['option'].is_tunable)


def config_to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


__all__ = ['VisionTowerConfig', 'LlamaConfig', 'dinov2_vit_l', 'siglip_so400m', 'require',
           'EngineConfig', 'MODES', 'DTYPES', 'TUNABLE_ENGINE_FIELDS', 'EngineOption',
           'engine_option', 'MAX_RELAX_WITH_PREVIOUS_ACTION']
