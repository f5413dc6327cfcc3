"""The Hugging Face transformers AR baseline: the anchor every speed ratio is measured against.

``make_baseline`` picks the family's: OpenVLA's below (``HFBaseline``), or pi0-FAST's
(``PaliGemmaBaseline``: the same weights in ``transformers.PaliGemmaForConditionalGeneration``,
greedy ``generate`` with ``token_type_ids`` marking the bidirectional prefix, stopping at the
codec's end marker or ``max_tokens``, as openpi decodes).

The same weights run in ``transformers.LlamaForCausalLM``; our vision towers + projector build
``inputs_embeds`` (transformers has no OpenVLA class without remote code, and remote code is never
run here). Decoding is ``generate(max_new_tokens=action_dim, do_sample=False)`` as OpenVLA's
``predict_action`` does, with EOS disabled so exactly ``action_dim`` tokens come out (the AR
reference never stops early either).

Two variants, both baselines (speed tables report a ratio against each):
- ``eager``: ``generate`` with its default dynamic KV cache, as OpenVLA ships.
- ``compiled``: what transformers' own performance guide prescribes for fast decoding, a
  ``StaticCache`` of fixed length (allocated once, reset per frame: one shape for every
  prompt, so one compilation) and ``torch.compile`` of the decode forward, which ``generate``
  applies itself when the cache is static (``CompileConfig``: inductor, "reduce-overhead",
  i.e. CUDA graphs). ``generate`` compiles only on accelerators unless the compile config
  says otherwise; ``compile_backend`` lets CPU tests run the same static-cache path through a
  cheap backend.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from .config import VLAConfig
from .engine.result import Frame
from .engine.device.runner import ModelRunner


def hf_llama_config(cfg: VLAConfig):
    from transformers import LlamaConfig
    llm = cfg.llm
    return LlamaConfig(
        vocab_size=llm.vocab_size, hidden_size=llm.hidden_size,
        intermediate_size=llm.intermediate_size, num_hidden_layers=llm.num_layers,
        num_attention_heads=llm.num_heads, num_key_value_heads=llm.num_kv_heads,
        rms_norm_eps=llm.rms_norm_eps, max_position_embeddings=llm.max_position_embeddings,
        rope_parameters={'rope_type': 'default', 'rope_theta': llm.rope_theta},
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        pad_token_id=cfg.pad_token_id, bos_token_id=1, eos_token_id=None)


def build_hf_llama(runner: ModelRunner, attn_implementation: str = 'sdpa'):
    """A transformers LlamaForCausalLM holding a copy of the runner's language-model weights."""
    from transformers import LlamaForCausalLM
    hf_cfg = hf_llama_config(runner.cfg)
    hf_cfg._attn_implementation = attn_implementation
    with torch.device(runner.device):
        hf = LlamaForCausalLM(hf_cfg).to(dtype=runner.dtype)
    missing, unexpected = hf.load_state_dict(runner.lm.state_dict(), strict=False)
    real_missing = [k for k in missing if 'rotary_emb' not in k]
    if real_missing or unexpected:
        raise RuntimeError(f'HF Llama key mismatch: missing {real_missing}, '
                           f'unexpected {unexpected}')
    return hf.to(device=runner.device, dtype=runner.dtype).eval()


VARIANTS = ('eager', 'compiled')


def make_baseline(runner: ModelRunner, engine_config, variant: str = 'eager'):
    """The transformers baseline of the runner's family."""
    from .config import Pi0FastConfig
    if isinstance(runner.cfg, Pi0FastConfig):
        if variant != 'eager':
            raise ValueError(f'variant {variant!r}: the PaliGemma baseline is eager only')
        return PaliGemmaBaseline(runner, engine_config)
    return HFBaseline(runner, engine_config, variant=variant)


class PaliGemmaBaseline:
    """pi0-FAST's baseline: transformers' PaliGemma on a copy of the runner's weights, its own
    vision tower included; our preprocessing and prompt ids (one camera and the zero state of
    ``Frame``'s defaults, or what ``generate_frame`` is given)."""

    label = 'hf'

    def __init__(self, runner: ModelRunner, engine_config):
        from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

        from .models.pi0fast.checkpoint import hf_name, paligemma_config_json
        self.runner = runner
        self.engine_config = engine_config
        hf_cfg = PaliGemmaConfig(**paligemma_config_json(runner.cfg))
        with torch.device(runner.device):
            model = PaliGemmaForConditionalGeneration(hf_cfg).to(dtype=runner.dtype)
        state = {hf_name(k): v for k, v in runner.model.state_dict().items()
                 if k != 'language_model.lm_head.weight'}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or set(missing) - {'lm_head.weight'}:
            raise RuntimeError(f'PaliGemma key mismatch: missing {missing}, unexpected '
                               f'{unexpected}')
        model.tie_weights()
        self.model = model.eval()
        self.image_token_id = hf_cfg.image_token_id

    @torch.no_grad()
    def generate_frame(self, frame: Frame) -> list[int]:
        runner = self.runner
        ids = runner.frame_prompt_ids(frame)
        pixels = runner.prepare_pixels(frame, self.engine_config)
        num_image_rows = runner.prefix_len(ids, len(frame.images)) - len(ids)
        input_ids = torch.tensor([[self.image_token_id] * num_image_rows + ids],
                                 device=runner.device)
        codec = runner.codec
        out = self.model.generate(input_ids=input_ids, pixel_values=pixels,
                                  attention_mask=torch.ones_like(input_ids),
                                  token_type_ids=torch.zeros_like(input_ids),
                                  max_new_tokens=codec.max_tokens, do_sample=False,
                                  num_beams=1, eos_token_id=codec.end_token, pad_token_id=0)
        return [int(t) for t in out[0, input_ids.shape[1]:]]

    def generate_tokens(self, image, instruction: str) -> list[int]:
        return self.generate_frame(Frame(image, instruction))

    def timed(self, image, instruction: str) -> tuple[list[int], float]:
        start = time.perf_counter()
        tokens = self.generate_tokens(image, instruction)
        return tokens, time.perf_counter() - start


class HFBaseline:
    """Greedy ``generate`` on transformers' Llama, fed our multimodal prompt embeddings."""

    def __init__(self, runner: ModelRunner, engine_config, attn_implementation: str = 'sdpa',
                 variant: str = 'eager', max_prompt_len: int | None = None,
                 compile_backend: str = 'inductor', hf_model=None,
                 action_tokens_only: bool = False):
        """``hf_model``: an existing ``build_hf_llama`` copy to share (a 7B copy is 15 GB;
        the eager and compiled baselines can run on one: only ``generate``'s cache differs).
        ``action_tokens_only``: greedy over the action tokens alone (every other id
        suppressed), the HF side of ``EngineConfig.restrict_to_action_tokens``."""
        if variant not in VARIANTS:
            raise ValueError(f'HFBaseline variant must be one of {VARIANTS}, got {variant!r}')
        self.runner = runner
        self.engine_config = engine_config
        self.variant = variant
        self.model = hf_model if hf_model is not None else build_hf_llama(runner,
                                                                          attn_implementation)
        self._generate_kwargs = {}
        if action_tokens_only:
            at = runner.codec
            self._generate_kwargs['suppress_tokens'] = [
                t for t in range(runner.cfg.llm.vocab_size)
                if not at.first_action_id <= t <= at.last_action_id]
        if variant == 'compiled':
            from transformers import StaticCache
            from transformers.generation.configuration_utils import CompileConfig
            max_prompt_len = max_prompt_len or runner.max_prefix_len(
                engine_config.max_instruction_tokens)
            self.cache = StaticCache(config=self.model.config,
                                     max_cache_len=max_prompt_len + runner.max_action_tokens)
            compile_config = CompileConfig(fullgraph=True, mode='reduce-overhead',
                                           backend=compile_backend)
            # generate() compiles only on accelerators unless told to compile everywhere
            # (transformers' own switch for this; CPU tests use a cheap backend).
            compile_config._compile_all_devices = True
            self._generate_kwargs.update(past_key_values=self.cache,
                                         compile_config=compile_config)

    @property
    def label(self) -> str:
        return 'hf' if self.variant == 'eager' else 'hf_compiled'

    def generate_frame(self, frame: Frame) -> list[int]:
        """``generate_tokens`` of the frame's image and instruction (OpenVLA reads one camera;
        the same call as ``PaliGemmaBaseline.generate_frame``)."""
        return self.generate_tokens(frame.image, frame.instruction)

    @torch.no_grad()
    def generate_tokens(self, image: np.ndarray, instruction: str) -> list[int]:
        prompt = self.runner.prepare_prompt(Frame(image, instruction), self.engine_config)
        embeds = prompt.embeds[None]
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        if self.variant == 'compiled':
            self.cache.reset()          # the one static cache, reused frame after frame
        out = self.model.generate(inputs_embeds=embeds, attention_mask=mask,
                                  max_new_tokens=self.runner.max_action_tokens,
                                  do_sample=False,
                                  num_beams=1, eos_token_id=None,
                                  pad_token_id=self.runner.cfg.pad_token_id,
                                  **self._generate_kwargs)
        return [int(t) for t in out[0, -self.runner.max_action_tokens:]]

    def timed(self, image: np.ndarray, instruction: str) -> tuple[list[int], float]:
        start = time.perf_counter()
        tokens = self.generate_tokens(image, instruction)
        return tokens, time.perf_counter() - start

    @torch.no_grad()
    def logits(self, embeds: torch.Tensor) -> torch.Tensor:
        """(L, H) -> (L, vocab) full-sequence logits of the HF model (for parity tests)."""
        return self.model(inputs_embeds=embeds[None]).logits[0]
