"""pi0-FAST's config class and presets (docs/pi0fast.md): PaliGemma's SigLIP tower and Gemma
decoder (``gemma_2b``: the generic ``LlamaConfig`` with Gemma's options), the camera slots, the
discretised state and the FAST chunk. Plain Python: the registry reads the presets without torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...config import SIGLIP_MEAN, SIGLIP_STD, LlamaConfig, VisionTowerConfig, require
from ...validation import check_int

# The spec modes' draft when EngineConfig.draft_path is unset (headless drafters' names,
# engine/drafting/draft_choice.py): the previous frame's tokens with the previous chunk shifted
# and re-encoded beside them in one tree, the best measured on FAST tokens
# (docs/speculation.md, Drafting FAST tokens).
DEFAULT_DRAFT = 'previous_action+shifted_chunk'
# config.json's "type" of the LeRobot policies read here: LeRobot 0.6's, and its older name.
LEROBOT_TYPES = ('pi0_fast', 'pi0fast')


@dataclass(frozen=True)
class Pi0FastConfig:
    """A pi0-FAST model (docs/pi0fast.md): PaliGemma = a SigLIP tower (every block, then its
    post-layernorm) -> one linear projector -> a Gemma decoder (``llm`` with Gemma's options),
    prefix-LM attention over ``num_image_slots`` images and the prompt
    ``Task: {instruction}, State: {state in 256 bins};\n`` after BOS; FAST action tokens.

    ``max_state_dim``: the state is zero-padded to this many dimensions before it is
    discretised (openpi / LeRobot: 32); ``state_dim`` is what a frame's state carries (the
    checkpoint's ``observation.state`` shape; a frame without a state gets zeros).
    ``chunk_size`` x ``action_dim``: the chunk the FAST codec decodes a frame to.
    """

    vision: VisionTowerConfig
    llm: LlamaConfig
    num_image_slots: int = 1
    state_dim: int = 8
    max_state_dim: int = 32
    chunk_size: int = 10
    action_dim: int = 7
    max_action_tokens: int = 256
    fast_skip_tokens: int = 128
    lowercase_instruction: bool = True
    # The spec modes' draft when EngineConfig.draft_path is unset (headless drafters' names,
    # engine/drafting/draft_choice.py): the previous frame's tokens with the previous chunk
    # shifted and re-encoded beside them in one tree, the best measured on FAST tokens
    # (docs/speculation.md, Drafting FAST tokens).
    default_draft: str = DEFAULT_DRAFT

    def __post_init__(self):
        require(isinstance(self.vision, VisionTowerConfig) and self.vision.kind == 'siglip',
                'vision', 'expected a siglip VisionTowerConfig')
        require(isinstance(self.llm, LlamaConfig), 'llm', 'expected a LlamaConfig')
        for name in ('num_image_slots', 'state_dim', 'max_state_dim', 'chunk_size',
                     'action_dim', 'max_action_tokens'):
            check_int(name, getattr(self, name), minimum=1)
        check_int('fast_skip_tokens', self.fast_skip_tokens, minimum=0)
        require(self.state_dim <= self.max_state_dim, 'state_dim',
                f'{self.state_dim} exceeds max_state_dim {self.max_state_dim}')
        require(isinstance(self.default_draft, str) and bool(self.default_draft),
                'default_draft', f'expected a drafter name, got {self.default_draft!r}')

    @property
    def image_size(self) -> int:
        return self.vision.image_size

    @property
    def num_patches(self) -> int:
        return self.vision.num_patches

    @property
    def action_chunk(self) -> int:
        """Control steps one frame decodes (what the node schedules a chunk by, as for a
        chunked OpenVLA checkpoint's ``action_chunk``)."""
        return self.chunk_size


def gemma_2b(vocab_size: int = 257152) -> LlamaConfig:
    """PaliGemma's Gemma-2B: width 2048, 18 layers, 8 query heads, 1 KV head of 256, GeGLU
    16384, RMSNorm (1 + w), scaled embeddings, tied head."""
    return LlamaConfig(hidden_size=2048, num_layers=18, num_heads=8, num_kv_heads=1,
                       head_dim=256, intermediate_size=16384, vocab_size=vocab_size,
                       max_position_embeddings=8192, norm_unit_offset=True,
                       hidden_act='gelu_tanh', embed_scale=True, tie_word_embeddings=True)


def _pi0fast_tiny() -> Pi0FastConfig:
    """pi0-FAST's structure, small dims, for tests and benches: a 2-block SigLIP at 28 px
    (4 patches per image), a 2-layer Gemma with one KV head of 16 (not width / heads), three
    image slots. Vocabulary 1024: the text tokenizer's ids, then FAST's, then 128 skipped."""
    return Pi0FastConfig(
        vision=VisionTowerConfig('siglip', 28, 14, 32, 2, 2, 64, mean=SIGLIP_MEAN,
                                 std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=48, num_layers=2, num_heads=4, num_kv_heads=1, head_dim=16,
                        intermediate_size=96, vocab_size=1024, max_position_embeddings=1024,
                        norm_unit_offset=True, hidden_act='gelu_tanh', embed_scale=True,
                        tie_word_embeddings=True),
        num_image_slots=3, state_dim=4, max_state_dim=8, chunk_size=4, action_dim=3,
        max_action_tokens=24)


def _metaworld_demo_fast() -> Pi0FastConfig:
    """The embedded pi0-FAST model (``metaworld-demo-fast``): PaliGemma's layout at
    ``metaworld-demo``'s size, one 64 x 64 image in 16-pixel patches (16 patches) through a
    3-block 96-wide SigLIP, a 4-layer 128-wide Gemma (one KV head of 32). Vocabulary 1024:
    256 text ids learned from the prompt's words and the Meta-World instructions, FAST ids
    below the 128 skipped ones. Chunks of 8 control steps x 7 dimensions; the demonstrations
    carry no proprioception, so the state is one zero (what the node sends without a state
    topic). ``max_action_tokens`` is the longest training frame with a margin
    (train/train_demo_fast.py writes the fitted value into config.json)."""
    return Pi0FastConfig(
        vision=VisionTowerConfig('siglip', 64, 16, 96, 3, 2, 384, mean=SIGLIP_MEAN,
                                 std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=1,
                        head_dim=32, intermediate_size=344, vocab_size=1024,
                        max_position_embeddings=512, norm_unit_offset=True,
                        hidden_act='gelu_tanh', embed_scale=True, tie_word_embeddings=True),
        num_image_slots=1, state_dim=1, max_state_dim=1, chunk_size=8, action_dim=7,
        max_action_tokens=64)


def _pi0fast_3b() -> Pi0FastConfig:
    """pi0-FAST's published shape (PaliGemma-3B, docs/pi0fast.md): SigLIP So400m/14 at 224 px
    (256 tokens per image; 27 blocks, 1152 wide, 16 heads, MLP 4304), Gemma-2B (18 layers,
    2048 wide, 8 heads, one KV head of 256, GeGLU 16384, vocabulary 257152, tied head), three
    cameras, an 8-dim state padded to 32, chunks of 10 x 7, at most 256 action tokens. For GPU
    benches with random weights (bench/gpu_pi0fast.py); no such checkpoint is embedded."""
    return Pi0FastConfig(
        vision=VisionTowerConfig('siglip', 224, 14, 1152, 27, 16, 4304, mean=SIGLIP_MEAN,
                                 std=SIGLIP_STD),
        llm=LlamaConfig(hidden_size=2048, num_layers=18, num_heads=8, num_kv_heads=1,
                        head_dim=256, intermediate_size=16384, vocab_size=257152,
                        max_position_embeddings=8192, norm_unit_offset=True,
                        hidden_act='gelu_tanh', embed_scale=True, tie_word_embeddings=True),
        num_image_slots=3, state_dim=8, max_state_dim=32, chunk_size=10, action_dim=7,
        max_action_tokens=256)


PRESETS = {
    'pi0fast-tiny': _pi0fast_tiny,
    'metaworld-demo-fast': _metaworld_demo_fast,
    'pi0fast-3b': _pi0fast_3b,
}
# The preset demo training trains (vla-spec train-demo-vla --family pi0fast; demo_training.py).
DEMO_PRESET = 'metaworld-demo-fast'


def config_of(cfg_or_preset: Pi0FastConfig | str) -> Pi0FastConfig:
    """A ``Pi0FastConfig`` as given, or the one of a pi0-FAST preset name (ValueError naming
    the presets otherwise)."""
    if isinstance(cfg_or_preset, Pi0FastConfig):
        return cfg_or_preset
    if cfg_or_preset not in PRESETS:
        raise ValueError(f'preset: {cfg_or_preset!r} is not a pi0-FAST preset; they are '
                         f'{sorted(PRESETS)}')
    return PRESETS[cfg_or_preset]()


__all__ = ['Pi0FastConfig', 'gemma_2b', 'PRESETS', 'DEMO_PRESET', 'DEFAULT_DRAFT',
           'LEROBOT_TYPES', 'config_of']
