"""The autoregressive reference (S1): one prefill, then greedy single-token decodes.

Every other decoding mode is tested against this function. It allocates a private KV cache per
request with slot == logical position, so nothing here depends on the ring or the scheduler.
"""
from __future__ import annotations

import torch

from ..models.attention import StepBatch
from .device.runner import ModelRunner


def causal_batch(start: int, count: int, device, num_bidirectional: int = 0) -> StepBatch:
    """Tokens at positions start..start+count-1 of one request whose slots equal positions;
    each reads the slots up to its own and, with ``num_bidirectional``, the request's first
    ``num_bidirectional`` slots too (a prefix-LM prompt read in both directions)."""
    pos = torch.arange(start, start + count, device=device)
    total = start + count
    cols = torch.arange(total, device=device)[None, :]
    mask = (cols <= pos[:, None]) | (cols < num_bidirectional)             # (count, total)
    return StepBatch(positions=pos, slot_mapping=pos, attn_mask=mask, kv_limit=total)


@torch.no_grad()
def run_ar(runner: ModelRunner, prefix_embeds: torch.Tensor, num_tokens: int,
           restrict_to_action_tokens: bool = False) -> tuple[list[int], torch.Tensor]:
    """prefix_embeds (L, H) -> (num_tokens greedy ids, features (L + num_tokens - 1, H)).

    ``features`` are the final-normed hidden states at every position the verifier consumed
    (what an EAGLE draft head is trained on).
    """
    length = prefix_embeds.shape[0]
    cache = runner.new_cache(length + num_tokens)
    hidden = runner.forward(prefix_embeds, causal_batch(0, length, runner.device,
                                                        runner.num_bidirectional(length)), cache)
    features = [hidden]
    token = runner.greedy(hidden[-1:], restrict_to_action_tokens)
    tokens = [int(token)]
    for i in range(1, num_tokens):
        embeds = runner.embed_tokens(token)
        hidden = runner.forward(embeds, causal_batch(length + i - 1, 1, runner.device), cache)
        features.append(hidden)
        token = runner.greedy(hidden, restrict_to_action_tokens)
        tokens.append(int(token))
    return tokens, torch.cat(features, dim=0)


def decode_ar(runner: ModelRunner, prefix_embeds: torch.Tensor, num_tokens: int,
              restrict_to_action_tokens: bool = False) -> tuple[list[int], int]:
    """prefix_embeds (L, H) -> (num_tokens greedy ids, number of forward passes)."""
    tokens, _ = run_ar(runner, prefix_embeds, num_tokens, restrict_to_action_tokens)
    return tokens, num_tokens


def reference_tokens(runner: ModelRunner, frames, engine_config) -> list[tuple[int, ...]]:
    """The S1 tokens of each frame (image + instruction): its prompt, then ``decode_ar`` in a
    private cache through dense attention — independent of the engine's ring, scheduler,
    segment attention, static buffers and graphs. What tests and benchmarks compare to."""
    out = []
    for frame in frames:
        prompt = runner.prepare_prompt(frame, engine_config)
        tokens, _ = decode_ar(runner, prompt.embeds, runner.max_action_tokens,
                              engine_config.restrict_to_action_tokens)
        out.append(runner.codec.cut((), tokens))     # up to the codec's end marker, if any
    return out
