"""The model protocol: what the engine, the drafters and the node need of a model family.

The engine is typed against these protocols, never against one family's classes. OpenVLA's
layout (``models/openvla/``: its vision towers, projector and checkpoint I/O over the Llama
decoder of ``models/llama.py``) is one family; another (a Qwen2 or Gemma decoder, other
towers) implements the same few methods, reusing ``models/layers.py`` and
``models/attention.py``, and the engine does not change (docs/architecture.md, Adding a model
family). How the generated tokens become actions is the codec's business
(``action_codec.ActionCodec``), not the model's.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

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


@runtime_checkable
class VLAModel(Protocol):
    """A vision-language-action model as the engine sees it."""

    language_model: Decoder

    def image_embeddings(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """(B, C, S, S) preprocessed pixels -> (B, P, H) patch embeddings in the decoder's
        space (the vision towers and the projector)."""

    def prompt_embeddings(self, patches: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        """A frame's (P, H) patches and its prompt ids (BOS first) -> the (L, H) rows its
        prefill feeds the decoder."""

    def token_embeddings(self, token_ids: torch.Tensor) -> torch.Tensor:
        """(N,) token ids -> (N, H) decoder input embeddings (decoded tokens, drafts)."""

    def image_embeddings_for(self, device) -> Callable[[torch.Tensor], torch.Tensor]:
        """``image_embeddings`` as it runs fastest on ``device``, with the same values (a
        family may run its towers side by side on a GPU)."""


__all__ = ['Decoder', 'VLAModel']
