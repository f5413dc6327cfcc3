"""OpenVLA's config class and presets (docs/openvla.md, Architecture).

``VLAConfig``: vision tower(s) -> GELU MLP projector -> Llama, with OpenVLA's action bins
(``n_action_bins`` ids at the top of the text vocabulary). The ``openvla-7b`` preset follows
docs/openvla.md (DINOv2-L/14 with 4 registers + SigLIP So400m/14 at 224 px, fused-GELU-MLP
projector, Llama-2-7B with vocab 32064). Single-tower models (one SigLIP or DINOv2 tower,
two-layer GELU-MLP projector) leave ``fused_featurizer`` as None. Plain Python: the registry
reads the presets without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config import (DINOV2_MEAN, DINOV2_STD, SIGLIP_MEAN, SIGLIP_STD, LlamaConfig,
                       VisionTowerConfig, dinov2_vit_l, require, siglip_so400m)

# The spec modes' draft when EngineConfig.draft_path is unset: each stream's previous action
# (engine/drafting/draft_choice.py's headless drafters), no draft model needed.
DEFAULT_DRAFT = 'previous_action'


@dataclass(frozen=True)
class VLAConfig:
    """An OpenVLA-architecture model: vision tower(s) → GELU MLP projector → Llama.

    Fused (OpenVLA-7B): ``featurizer`` DINOv2 and ``fused_featurizer`` SigLIP read the same
    image, their patch features are concatenated, and the projector has three layers. Single
    tower (Prismatic's ``siglip-vit-so400m`` style): ``fused_featurizer`` is None, the one
    ``featurizer`` is SigLIP or DINOv2, and the projector has two layers.
    """

    featurizer: VisionTowerConfig
    fused_featurizer: VisionTowerConfig | None
    llm: LlamaConfig
    n_action_bins: int = 256
    pad_to_multiple_of: int = 64
    pad_token_id: int = 32000
    action_dim: int = 7
    # Control steps one frame decodes (a chunked policy: action_chunk * action_dim tokens, step
    # after step); OpenVLA's checkpoints decode one.
    action_chunk: int = 1

    def __post_init__(self):
        f, g = self.featurizer, self.fused_featurizer
        require(isinstance(f, VisionTowerConfig), 'featurizer',
                f'expected a VisionTowerConfig, got {type(f).__name__}')
        require(g is None or isinstance(g, VisionTowerConfig), 'fused_featurizer',
                f'expected a VisionTowerConfig or None (one tower), got {type(g).__name__}')
        require(isinstance(self.llm, LlamaConfig), 'llm',
                f'expected a LlamaConfig, got {type(self.llm).__name__}')
        if g is not None:
            require(f.kind == 'dinov2', 'featurizer.kind',
                    f'{f.kind!r} in a fused backbone: OpenVLA fuses DINOv2 first')
            require(g.kind == 'siglip', 'fused_featurizer.kind',
                    f'{g.kind!r}: OpenVLA fuses SigLIP second')
            require(f.image_size == g.image_size and f.patch_size == g.patch_size,
                    'fused_featurizer', f'both towers must see the same image and patch '
                    f'sizes, got {f.image_size}/{f.patch_size} and '
                    f'{g.image_size}/{g.patch_size}')
        require(self.n_action_bins >= 2, 'n_action_bins', 'must be >= 2')
        require(self.pad_to_multiple_of >= 0, 'pad_to_multiple_of', 'must be >= 0')
        require(self.action_dim > 0, 'action_dim', 'must be > 0')
        require(isinstance(self.action_chunk, int) and self.action_chunk >= 1, 'action_chunk',
                f'must be an int >= 1, got {self.action_chunk!r}')
        require(self.text_vocab_size - self.n_action_bins >= 3, 'llm.vocab_size',
                f'vocab_size - pad_to_multiple_of = {self.text_vocab_size} leaves no room for '
                f'{self.n_action_bins} action bins plus special tokens')

    # Facts of the vision backbone, derived from the tower(s) here and nowhere else.
    @property
    def is_fused(self) -> bool:
        """Two towers (OpenVLA's ``use_fused_vision_backbone``), else one."""
        return self.fused_featurizer is not None

    @property
    def towers(self) -> tuple[VisionTowerConfig, ...]:
        """The towers in input-channel order: (featurizer,) or (featurizer, fused)."""
        return (self.featurizer,) if self.fused_featurizer is None \
            else (self.featurizer, self.fused_featurizer)

    @property
    def pixel_channels(self) -> int:
        """Channels of ``pixel_values``: 3 per tower, each normalised with its tower's stats."""
        return 3 * len(self.towers)

    @property
    def image_size(self) -> int:
        return self.featurizer.image_size       # every tower's (checked)

    @property
    def num_patches(self) -> int:
        return self.featurizer.num_patches      # every tower's (same image and patch sizes)

    @property
    def vision_dim(self) -> int:
        """Width of the backbone's output: the towers' widths added (features concatenated)."""
        return sum(tower.embed_dim for tower in self.towers)

    @property
    def text_vocab_size(self) -> int:
        """OpenVLA's V: action token ids are V-1 (bin 0) down to V-n_action_bins."""
        return self.llm.vocab_size - self.pad_to_multiple_of


def _openvla_7b() -> VLAConfig:
    return VLAConfig(
        featurizer=dinov2_vit_l(224),
        fused_featurizer=siglip_so400m(224),
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


def _tiny_siglip() -> VLAConfig:
    """``tiny`` with a single SigLIP tower (no DINOv2, two-layer projector): the layout of
    Prismatic's ``siglip-vit-so400m`` backbones, for tests."""
    return VLAConfig(
        featurizer=VisionTowerConfig('siglip', 56, 14, 48, 3, 2, 96,
                                     mean=SIGLIP_MEAN, std=SIGLIP_STD),
        fused_featurizer=None,
        llm=LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=160,
                        vocab_size=1088, max_position_embeddings=512),
        pad_token_id=1024,
    )


def _metaworld_demo() -> VLAConfig:
    """The embedded default model's architecture: 64 x 64 images in 16-pixel patches
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
    'tiny-siglip': _tiny_siglip,
    'metaworld-demo': _metaworld_demo,
}
# The preset demo training trains (vla-spec train-demo-vla; demo_training.py).
DEMO_PRESET = 'metaworld-demo'


def config_of(cfg_or_preset: VLAConfig | str) -> VLAConfig:
    """A ``VLAConfig`` as given, or the one of an OpenVLA preset name (ValueError naming the
    presets otherwise)."""
    if isinstance(cfg_or_preset, VLAConfig):
        return cfg_or_preset
    if cfg_or_preset not in PRESETS:
        raise ValueError(f'preset: {cfg_or_preset!r} is not an OpenVLA preset; they are '
                         f'{sorted(PRESETS)}')
    return PRESETS[cfg_or_preset]()


__all__ = ['VLAConfig', 'PRESETS', 'DEMO_PRESET', 'DEFAULT_DRAFT', 'config_of']
