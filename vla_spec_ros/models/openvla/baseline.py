"""OpenVLA's transformers baseline: the anchor every OpenVLA speed ratio is measured against.

The same weights run in ``transformers.LlamaForCausalLM``; our vision towers + projector build
``inputs_embeds`` (transformers has no OpenVLA class without remote code, and remote code is never
run here). Decoding is ``generate(max_new_tokens=action_dim, do_sample=False)`` as OpenVLA's
``predict_action`` does, with EOS disabled so exactly ``action_dim`` tokens come out (the AR
reference never stops early either).

Two variants, both baselines (speed tables report a ratio against each):
- ``eager``: ``generate`` with its default dynamic KV cache, as OpenVLA ships.
- ``compiled``: a static cache and ``torch.compile`` of the decode forward, as transformers'
  performance guide prescribes (models/static_generate.py, shared with the other families).

A baseline runs on an engine's ``ModelRunner`` (its prompt, preprocessing and weights): it is
handed the runner and the frames, and never builds either (baseline.py, above the engine, does).
"""
from __future__ import annotations

import torch

from ..static_generate import StaticGenerate
from .config import VLAConfig


def hf_llama_config(cfg: VLAConfig):
    """transformers' ``LlamaConfig`` of the decoder (no tied head, EOS disabled)."""
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


def build_hf_llama(runner, attn_implementation: str = 'sdpa'):
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


def make_baseline(runner, engine_config, variant: str = 'eager') -> 'HFBaseline':
    return HFBaseline(runner, engine_config, variant=variant)


class HFBaseline:
    """Greedy ``generate`` on transformers' Llama, fed our multimodal prompt embeddings."""

    def __init__(self, runner, engine_config, attn_implementation: str = 'sdpa',
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
        self.static = None
        if variant == 'compiled':
            max_prompt_len = max_prompt_len or runner.max_prefix_len(
                engine_config.max_instruction_tokens)
            self.static = StaticGenerate(self.model, max_prompt_len + runner.max_action_tokens,
                                         compile_backend)
            self._generate_kwargs.update(self.static.kwargs)

    @property
    def label(self) -> str:
        return 'hf' if self.variant == 'eager' else 'hf_compiled'

    @torch.no_grad()
    def generate_frame(self, frame) -> list[int]:
        """The greedy action tokens of a frame (OpenVLA reads its one camera and no state)."""
        prompt = self.runner.prepare_prompt(frame, self.engine_config)
        embeds = prompt.embeds[None]
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        if self.static is not None:
            self.static.reset()
        out = self.model.generate(inputs_embeds=embeds, attention_mask=mask,
                                  max_new_tokens=self.runner.max_action_tokens,
                                  do_sample=False,
                                  num_beams=1, eos_token_id=None,
                                  pad_token_id=self.runner.cfg.pad_token_id,
                                  **self._generate_kwargs)
        return [int(t) for t in out[0, -self.runner.max_action_tokens:]]

    @torch.no_grad()
    def logits(self, embeds: torch.Tensor) -> torch.Tensor:
        """(L, H) -> (L, vocab) full-sequence logits of the HF model (for parity tests)."""
        return self.model(inputs_embeds=embeds[None]).logits[0]


__all__ = ['HFBaseline', 'VARIANTS', 'build_hf_llama', 'hf_llama_config', 'make_baseline']
