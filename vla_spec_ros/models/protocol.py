"""The model protocol: what the engine, the drafters and the node need of a model family.

The engine is typed against these protocols, never against one family's classes. OpenVLA's
layout (``models/openvla/``: its vision towers, projector and checkpoint I/O over the Llama
decoder of ``models/llama.py``) is one family; another (a Qwen2 or Gemma decoder, other
towers) implements the same few methods, reusing ``models/layers.py`` and
``models/attention.py``, and the engine does not change (docs/architecture.md, Adding a model
family). How the generated tokens become actions is the codec's business
(``action_codec.ActionCodec``), not the model's; a family names its default codec
(``action_codec``).

What a family tells the engine beyond its forwards, so that no engine module reads a family's
config: its decoder's width, vocabulary and positions, its image slots and size, whether its
prompt reads a robot state, and its prefix attention rule (``PREFIX_ATTENTION``: ``causal``,
OpenVLA; ``bidirectional``, a prefix-LM such as PaliGemma, where a frame's images and prompt
attend to each other in both directions and generated tokens attend causally). Its prompt
comes from a ``PromptBuilder`` (the instruction, and the state when the family reads one ->
token ids) and its pixels from ``preprocess``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

if TYPE_CHECKING:       # annotations only: the protocol itself needs no torch
    import torch

    from .attention import KVCache, StepBatch
    from .layers import LayerKernels


@runtime_checkable
class Decoder(Protocol):
    """The language model a verifier forward runs: packed rows over a paged KV cache."""

    def new_kv_cache(self, num_slots: int) -> KVCache:
        """A KV cache of ``num_slots`` slots for every layer."""

    def forward_hidden(self, inputs_embeds: torch.Tensor, batch: StepBatch, cache: KVCache,
                       kernels: LayerKernels = ...) -> torch.Tensor:
        """(T, H) input embeddings of a packed step -> (T, H) final-normed hidden states (the
        features an EAGLE draft head reads); writes the rows' K/V to their slots."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(T, H) -> (T, vocab)."""


PREFIX_ATTENTION = ('causal', 'bidirectional')


@runtime_checkable
class PromptBuilder(Protocol):
    """A family's prompt: the instruction (and the robot state, for a family that reads one)
    -> the text ids of a frame's prompt (BOS first), ``PromptError`` (a ``ValueError``) for
    an instruction or state it cannot take."""

    def encode(self, instruction: str, state: Any = None) -> list[int]:
        """-> prompt token ids."""

    def max_prompt_len(self, max_instruction_tokens: int) -> int:
        """Most ids ``encode`` returns for an instruction of at most that many tokens (the
        ring is sized by it)."""


@runtime_checkable
class VLAModel(Protocol):
    """A vision-language-action model as the engine sees it."""

    language_model: Decoder
    hidden_size: int            # decoder width (rows of the packed step)
    vocab_size: int             # logits per row
    max_positions: int          # RoPE positions a frame may use (prompt + generated)
    image_size: int             # side of the square image the towers see
    num_image_slots: int        # images a frame may carry: 1 .. num_image_slots
    prefix_attention: str       # one of PREFIX_ATTENTION
    uses_state: bool            # whether the prompt reads ``Frame.state``
    default_draft: str | None   # the headless draft the family measured best; None: the
    #                             engine's default (the previous action)

    def preprocess(self, image: torch.Tensor, *, center_crop: bool = False,
                   rotate_180: bool = False) -> torch.Tensor:
        """(H, W, 3) uint8 tensor (any device) -> (C, S, S) float64 pixel values on the
        tensor's device, as the family's own preprocessing computes them."""

    def prefix_len(self, num_prompt_ids: int, num_images: int) -> int:
        """Rows of a frame's prefill: its images' patches and its prompt ids."""

    def action_codec(self):
        """The family's default ``action_codec.ActionCodec``."""

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) preprocessed pixels -> (B, P, H) patch embeddings in the decoder's
        space (the vision towers and the projector)."""

    def prompt_embeddings(self, patches: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """A frame's (I * P, H) patches (its I images' in slot order) and its prompt ids (BOS
        first) -> the (L, H) rows its prefill feeds the decoder (L = ``prefix_len``)."""

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(N,) token ids -> (N, H) decoder input embeddings (decoded tokens, drafts), with
        any scale the decoder applies to token embeddings (Gemma's sqrt(width))."""

    def image_embeddings_for(self, device) -> Callable[[torch.Tensor], torch.Tensor]:
        """``image_embeddings`` as it runs fastest on ``device``, with the same values (a
        family may run its towers side by side on a GPU)."""


__all__ = ['Decoder', 'VLAModel', 'PromptBuilder', 'PREFIX_ATTENTION']
