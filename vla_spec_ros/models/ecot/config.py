"""ECoT's config class and presets.

``EcotConfig`` is OpenVLA's ``VLAConfig`` (the same towers, projector and decoder) with what an
ECoT checkpoint adds: ``max_reasoning_tokens``, the text budget before the action (ECoT's own
``generate`` allows 1024 new tokens), and ``image_resize_strategy`` (Prismatic's ``letterbox``
for the released policies, ``resize-naive`` as OpenVLA's). Presets: ``ecot-openvla-7b-bridge``
(the released policy's shape: SigLIP So400m/14 at 224 px alone, the two-layer projector,
Vicuna v1.5 7B) and ``ecot-tiny`` (the same layout, small, for tests). Plain Python.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

from ...config import (SIGLIP_MEAN, SIGLIP_STD, LlamaConfig, VisionTowerConfig, require,
                       siglip_so400m)
from ..openvla.config import PRESETS as OPENVLA_PRESETS
from ..openvla.config import VLAConfig

# A reasoning policy's previous output, re-anchored by context, is its best draft
# (engine/drafting/previous_output_drafter.py).
DEFAULT_DRAFT = 'previous_output'
RESIZE_STRATEGIES = ('letterbox', 'resize-naive')
DEFAULT_MAX_REASONING_TOKENS = 1024


@dataclass(frozen=True)
class EcotConfig(VLAConfig):
    """OpenVLA's architecture, reasoning before the action (module docstring)."""

    max_reasoning_tokens: int = DEFAULT_MAX_REASONING_TOKENS
    image_resize_strategy: str = 'letterbox'

    def __post_init__(self):
        super().__post_init__()
        require(isinstance(self.max_reasoning_tokens, int) and self.max_reasoning_tokens >= 1,
                'max_reasoning_tokens', f'must be an int >= 1, got {self.max_reasoning_tokens!r}')
        require(self.image_resize_strategy in RESIZE_STRATEGIES, 'image_resize_strategy',
                f'{self.image_resize_strategy!r} not in {RESIZE_STRATEGIES}')
        require(self.action_chunk == 1, 'action_chunk',
                'an ECoT policy decodes one action after its reasoning')

    @classmethod
    def from_vla(cls, cfg: VLAConfig, **changes) -> 'EcotConfig':
        """An OpenVLA config read from the same layout, with ECoT's fields."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(VLAConfig)}, **changes)


def _ecot_openvla_7b_bridge() -> EcotConfig:
    return EcotConfig(
        featurizer=siglip_so400m(224), fused_featurizer=None,
        llm=LlamaConfig(hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=11008,
                        vocab_size=32064, max_position_embeddings=2048),
        pad_token_id=32000)


def _ecot_tiny() -> EcotConfig:
    """ECoT's layout, small (a few MB), for tests: one SigLIP tower at 56 px, a 2-layer Llama
    with room for a 256-token reasoning (positions 1024)."""
    return EcotConfig(
        featurizer=VisionTowerConfig('siglip', 56, 14, 48, 3, 2, 96,
                                     mean=SIGLIP_MEAN, std=SIGLIP_STD),
        fused_featurizer=None,
        llm=LlamaConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=160,
                        vocab_size=1088, max_position_embeddings=1024),
        pad_token_id=1024, max_reasoning_tokens=256)


def _metaworld_demo_reason() -> EcotConfig:
    """The embedded reasoning model's architecture: OpenVLA's ``metaworld-demo`` (64 px,
    fused DINOv2 + SigLIP towers of 3 blocks, a 4-layer 128-wide Llama) with a 768-id
    tokenizer learned from the prompts and the reasoning texts (the last 256 ids the action
    bins) and a 160-token reasoning budget (its texts run 50-90 tokens)."""
    base = OPENVLA_PRESETS['metaworld-demo']()
    return EcotConfig.from_vla(replace(base, llm=replace(base.llm, vocab_size=832),
                                       pad_token_id=768),
                               max_reasoning_tokens=160, image_resize_strategy='letterbox')


PRESETS = {
    'ecot-openvla-7b-bridge': _ecot_openvla_7b_bridge,
    'ecot-tiny': _ecot_tiny,
    'metaworld-demo-reason': _metaworld_demo_reason,
}
DEMO_PRESET = 'metaworld-demo-reason'

__all__ = ['DEMO_PRESET', 'DEFAULT_DRAFT', 'DEFAULT_MAX_REASONING_TOKENS', 'EcotConfig', 'PRESETS',
           'RESIZE_STRATEGIES']
