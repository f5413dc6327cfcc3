"""ECoT's transformers baseline: OpenVLA's (models/openvla/baseline.py: the same weights in
``transformers.LlamaForCausalLM``, our towers' prompt embeddings) decoding as ECoT's own
``generate`` does, greedy until the policy is done: here until the codec calls the frame
complete (the 7 bins after ``ACTION:``, or EOS, or the reasoning budget), which is where the
engine stops too; ECoT's own code would decode one more token, the EOS after the bins.
"""
from __future__ import annotations

import torch

from ..openvla.baseline import HFBaseline


class _CodecStops:
    """A transformers stopping criterion: the codec says the frame is complete."""

    def __init__(self, codec):
        self.codec = codec

    def __call__(self, input_ids, scores, **kwargs):
        done = self.codec.is_complete([int(t) for t in input_ids[0]])
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool,
                          device=input_ids.device)


class EcotBaseline(HFBaseline):
    """Greedy ``generate`` on transformers' Llama until the reasoning and its action are done."""

    @torch.no_grad()
    def generate_frame(self, frame) -> list[int]:
        from transformers import StoppingCriteriaList
        prompt = self.runner.prepare_prompt(frame, self.engine_config)
        embeds = prompt.embeds[None]
        mask = torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device)
        if self.static is not None:
            self.static.reset()
        codec = self.runner.codec
        out = self.model.generate(inputs_embeds=embeds, attention_mask=mask,
                                  max_new_tokens=codec.max_tokens, do_sample=False,
                                  num_beams=1, eos_token_id=None,
                                  pad_token_id=self.runner.cfg.pad_token_id,
                                  stopping_criteria=StoppingCriteriaList([_CodecStops(codec)]),
                                  **self._generate_kwargs)
        return [int(t) for t in out[0]]


def make_baseline(runner, engine_config, variant: str = 'eager') -> EcotBaseline:
    return EcotBaseline(runner, engine_config, variant=variant)


__all__ = ['EcotBaseline', 'make_baseline']
