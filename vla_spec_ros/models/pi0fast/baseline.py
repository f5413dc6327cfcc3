"""pi0-FAST's transformers baseline: the same weights in
``transformers.PaliGemmaForConditionalGeneration``, greedy ``generate`` with ``token_type_ids``
marking the bidirectional prefix, stopping at the codec's end marker or ``max_tokens``, as
openpi decodes (and LeRobot's pi0_fast, which stops at ``|``: a baseline that decoded past the
model's end would flatter every ratio against it).

Two variants, as OpenVLA's (models/openvla/baseline.py):
- ``eager``: ``generate`` with its default dynamic KV cache;
- ``compiled``: a static cache and ``torch.compile`` of the decode forward
  (models/static_generate.py).

A baseline runs on an engine's ``ModelRunner`` (its prompt, preprocessing and weights): it is
handed the runner and the frames, and never builds either (baseline.py, above the engine, does).
"""
from __future__ import annotations

import torch

from ..static_generate import StaticGenerate
from .checkpoint import hf_name, paligemma_config_json


VARIANTS = ('eager', 'compiled')


def make_baseline(runner, engine_config, variant: str = 'eager') -> 'PaliGemmaBaseline':
    return PaliGemmaBaseline(runner, engine_config, variant=variant)


class PaliGemmaBaseline:
    """pi0-FAST's baseline: transformers' PaliGemma on a copy of the runner's weights, its own
    vision tower included; our preprocessing and prompt ids (one camera and the zero state of
    ``Frame``'s defaults, or what ``generate_frame`` is given)."""

    def __init__(self, runner, engine_config, variant: str = 'eager',
                 compile_backend: str = 'inductor'):
        from transformers import PaliGemmaConfig, PaliGemmaForConditionalGeneration

        if variant not in VARIANTS:
            raise ValueError(f'variant {variant!r}: the PaliGemma baseline is one of '
                             f'{VARIANTS}')
        self.runner = runner
        self.engine_config = engine_config
        self.variant = variant
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
        self.static = StaticGenerate(
            self.model, runner.max_prefix_len(engine_config.max_instruction_tokens)
            + runner.codec.max_tokens, compile_backend) if variant == 'compiled' else None

    @property
    def label(self) -> str:
        return 'hf' if self.variant == 'eager' else 'hf_compiled'

    @torch.no_grad()
    def generate_frame(self, frame) -> list[int]:
        """The greedy tokens of a frame (its images and state), ended by the codec's end marker
        or ``max_tokens``."""
        runner = self.runner
        ids = runner.frame_prompt_ids(frame)
        pixels = runner.prepare_pixels(frame, self.engine_config)
        num_image_rows = runner.prefix_len(ids, len(frame.images)) - len(ids)
        input_ids = torch.tensor([[self.image_token_id] * num_image_rows + ids],
                                 device=runner.device)
        codec = runner.codec
        if self.static is not None:
            self.static.reset()
        out = self.model.generate(input_ids=input_ids, pixel_values=pixels,
                                  attention_mask=torch.ones_like(input_ids),
                                  token_type_ids=torch.zeros_like(input_ids),
                                  max_new_tokens=codec.max_tokens, do_sample=False,
                                  num_beams=1, eos_token_id=codec.end_token, pad_token_id=0,
                                  **(self.static.kwargs if self.static is not None else {}))
        return [int(t) for t in out[0, input_ids.shape[1]:]]


__all__ = ['PaliGemmaBaseline', 'VARIANTS', 'make_baseline']
