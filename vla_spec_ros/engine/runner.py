"""Model runner: turns frames into prompt embeddings and runs packed verifier forwards.

It owns the loaded model, the prompt tokenizer and the dtype/device, and knows nothing about
scheduling. Every decoding strategy (AR reference, pipeline, speculation) calls ``forward`` with
an explicit ``StepBatch``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..actions import ActionTokenizer
from ..config import EngineConfig, VLAConfig
from ..models.layers import KVCache, StepBatch
from ..models.vla import OpenVLA
from ..preprocess import preprocess_image
from ..prompt import PromptTokenizer
from .result import Frame

TORCH_DTYPES = {'float32': torch.float32, 'float64': torch.float64,
                'bfloat16': torch.bfloat16, 'float16': torch.float16}


@dataclass
class PreparedPrompt:
    input_ids: list[int]            # BOS + text ids (trailing "▁" rule applied)
    embeds: torch.Tensor            # (L, H) = BOS + patches + text, L = len(ids) + patches


class ModelRunner:
    def __init__(self, model: OpenVLA, cfg: VLAConfig, tokenizer: PromptTokenizer,
                 engine_cfg: EngineConfig):
        self.model = model
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.dtype = TORCH_DTYPES[engine_cfg.dtype]
        self.device = torch.device(engine_cfg.device)
        self.action_tokenizer = ActionTokenizer(cfg.llm.vocab_size, cfg.pad_to_multiple_of,
                                                cfg.n_action_bins)
        self.kernel = None          # fused RoPE + KV write (kernels/), set by the engine
        self._action_mask = None

    @property
    def action_dim(self) -> int:
        return self.cfg.action_dim

    @property
    def lm(self):
        return self.model.language_model

    def validate_instruction(self, instruction: str) -> list[int]:
        return self.tokenizer.encode(instruction)

    def prefix_len(self, input_ids: list[int]) -> int:
        return len(input_ids) + self.cfg.num_patches

    def max_prefix_len(self, max_instruction_tokens: int) -> int:
        """Longest prefill an accepted instruction can produce (BOS, template, "▁" included)."""
        # +8: tokenisation of the template around an instruction may merge differently.
        return self.cfg.num_patches + self.tokenizer.prompt_overhead + max_instruction_tokens + 8

    @torch.no_grad()
    def prepare_prompt(self, frame: Frame, engine_cfg: EngineConfig,
                       input_ids: list[int] | None = None) -> PreparedPrompt:
        ids = input_ids if input_ids is not None else self.tokenizer.encode(frame.instruction)
        pixels = preprocess_image(frame.image, self.cfg, center_crop=engine_cfg.center_crop,
                                  rotate_180=engine_cfg.rotate_180, dtype=self.dtype,
                                  device=self.device)
        patches = self.model.image_embeddings(pixels[None])[0]          # (P, H)
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        return PreparedPrompt(ids, self.model.prompt_embeddings(patches, ids_t))

    def new_cache(self, num_slots: int) -> KVCache:
        return self.lm.new_kv_cache(num_slots)

    @torch.no_grad()
    def forward(self, embeds: torch.Tensor, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        """(T, H) packed input embeddings -> final-normed hidden states (T, H)."""
        return self.lm.forward_hidden(embeds, batch, cache, self.kernel)

    @torch.no_grad()
    def greedy(self, hidden: torch.Tensor, restrict_to_action_tokens: bool) -> torch.Tensor:
        """(T, H) hidden -> (T,) argmax token ids (S1: over the full vocabulary by default)."""
        logits = self.lm.logits(hidden)
        if restrict_to_action_tokens:
            if self._action_mask is None:
                at = self.action_tokenizer
                mask = torch.full((logits.shape[-1],), float('-inf'), dtype=logits.dtype,
                                  device=logits.device)
                mask[at.first_action_id:at.last_action_id + 1] = 0
                self._action_mask = mask
            logits = logits + self._action_mask
        return logits.argmax(dim=-1)

    def embed_tokens(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.token_embeddings(token_ids)
