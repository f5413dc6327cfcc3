"""The ECoT model: OpenVLA's towers, projector and decoder (models/openvla/vla.py), with ECoT's
preprocessing and codec.

- ``preprocess``: the letterbox resize (letterbox.py) on the host when the checkpoint asks for
  it, then OpenVLA's normalisation; a frame already S x S is only normalised.
- ``action_codec``: reasoning, ``ACTION:``, a "▁" token, then OpenVLA's 7 bins, ended early by
  EOS (codecs/reasoning.py), its text read by reasoning_text.py. The tokens come from the
  checkpoint's tokenizer, given once by ``use_prompt`` when the family loads the model.
- ``default_draft``: the previous output, re-anchored by context (``previous_output``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...codecs.reasoning import ReasoningThenAction
from ..openvla.vla import OpenVLA
from .config import DEFAULT_DRAFT, EcotConfig
from .letterbox import letterbox, mean_fill
from .reasoning_text import parse_reasoning


class EcotVLA(OpenVLA):
    default_draft = DEFAULT_DRAFT

    def __init__(self, cfg: EcotConfig):
        super().__init__(cfg)
        self.prompt = None                  # EcotPrompt, set by use_prompt

    def use_prompt(self, prompt) -> None:
        """The checkpoint's prompt builder (its tokenizer gives the codec's tokens)."""
        self.prompt = prompt

    def preprocess(self, image: torch.Tensor, *, center_crop: bool = False,
                   rotate_180: bool = False) -> torch.Tensor:
        """(H, W, 3) uint8 -> (3, S, S) float64: letterboxed on the host when the frame is not
        already S x S (module docstring), then OpenVLA's normalisation."""
        size = self.cfg.image_size
        if self.cfg.image_resize_strategy == 'letterbox' and tuple(image.shape[:2]) != (
                size, size):
            if center_crop:
                raise ValueError('center_crop: an ECoT checkpoint letterboxes its frames; a '
                                 'centre crop is not part of its preprocessing')
            source = getattr(image, 'host_source', None)
            host = source.image if source is not None else image.cpu().numpy()
            if rotate_180:
                host, rotate_180 = host[::-1, ::-1], False
            square = letterbox(host, size, mean_fill(self.cfg.featurizer.mean))
            image = torch.from_numpy(np.ascontiguousarray(square)).to(image.device)
        return super().preprocess(image, center_crop=center_crop, rotate_180=rotate_180)

    def action_codec(self) -> ReasoningThenAction:
        if self.prompt is None:
            raise RuntimeError('action_codec: the ECoT model has no prompt builder yet '
                               '(models/ecot/checkpoint.load_model sets it)')
        prompt, cfg = self.prompt, self.cfg

        def describe(tokens):
            return parse_reasoning(prompt.decode(tokens), len(tokens))

        return ReasoningThenAction(super().action_codec(), prompt.marker_ids(),
                                   separator=(prompt.space_id,), stop_tokens=(prompt.eos_id,),
                                   max_reasoning_tokens=cfg.max_reasoning_tokens,
                                   describe_text=describe)


__all__ = ['EcotVLA']
