"""A test aid: random pi0-FAST weights whose greedy decoding writes one valid FAST frame.

A random-weight model's FAST tokens almost never form a chunk (the frame must be "Action: ",
FAST ids spelling exactly H x D coefficients, then the end marker), so its frames are refused
and a node serving it never moves. To try the node's paths (several cameras, a robot state,
chunks on the control clock) without a trained checkpoint, ``make-checkpoint
--decodable-chunks`` writes a random model with a chain in its language model:

1. the frame: a synthetic smooth chunk (codecs/fast_synthetic.py, chosen by the seed)
   encoded by the checkpoint's own FAST codec, whose tokens, with the prompt's last token
   before them (BOS in LeRobot's style), are all different;
2. the token embeddings are scaled by ``EMBED_GAIN``: at a text position the residual
   stream is then the token's own embedding, and what the layers add (from the images, the
   prompt, the state) is small beside it;
3. the LM head gets a weight of its own (untied, as LeRobot's checkpoints keep it) that
   maps the final-normed embedding of each chain token to ``CHAIN_LOGIT`` on the next one
   and 0 on every other token (a least-squares solve, exact for at most ``hidden_size``
   chain tokens), plus the random head's part orthogonal to those embeddings.

Greedy decoding then writes the same frame for every observation, decodable, ending at the
end marker; the layers' share still moves the logits with the images and the state (so the
drafts and their verification see varied distributions), never their argmax. The actions
ignore the observation: this is a way to exercise the plumbing, not a policy.
``vla_spec_pi0fast.json`` records the frame and its normalised chunk (``decodable``).
"""
from __future__ import annotations

import numpy as np
import torch

from ...codecs.fast_synthetic import synthetic_action_chunks
from .model import Pi0Fast

EMBED_GAIN = 64.0       # token embeddings x this: the residual stream is the token's own
CHAIN_LOGIT = 30.0      # the next chain token's logit; every other token's is about 0
NUM_CANDIDATES = 256    # synthetic chunks tried for a frame whose tokens are all different


def chain_frame(codec, start_token: int, max_chain: int, seed: int = 0):
    """-> (frame token ids, its normalised (H, D) chunk): the first synthetic chunk whose
    frame fits ``codec.max_tokens`` and, after ``start_token``, repeats no token (each chain
    token has one successor) within ``max_chain`` tokens."""
    horizon, dim = codec.action_shape
    for chunk in synthetic_action_chunks(NUM_CANDIDATES, horizon, dim, seed=seed + 1):
        try:
            frame = codec.encode(chunk)
        except ValueError:          # too long for max_tokens
            continue
        chain = (int(start_token), *frame)
        if len(set(chain[:-1])) == len(chain) - 1 and len(chain) - 1 <= max_chain:
            decoded = codec.decode(frame)
            assert decoded.is_valid, decoded.invalid_reason
            return tuple(int(t) for t in frame), decoded.normalized
    raise ValueError(f'decodable chunks: no synthetic ({horizon}, {dim}) chunk gives a frame of '
                     f'at most {max_chain} distinct tokens within max_tokens {codec.max_tokens}')


def make_decodable_(model: Pi0Fast, start_token: int, frame) -> None:
    """Set ``model``'s embeddings and untied head so that greedy decoding after
    ``start_token`` writes ``frame`` (module docstring, steps 2-3)."""
    lm = model.language_model
    if lm.lm_head.weight is lm.model.embed_tokens.weight:
        raise ValueError('decodable chunks: the model\'s head is tied to its embeddings; build '
                         'it with tie_word_embeddings=False')
    chain = [int(start_token), *(int(t) for t in frame)]
    with torch.no_grad():
        lm.model.embed_tokens.weight.mul_(EMBED_GAIN)
        # The final hidden state at a chain token, the layers' share left out: the final norm
        # of the token's (scaled) embedding. Solved in float64 on the host.
        ids = torch.tensor(chain[:-1], device=lm.lm_head.weight.device)
        hidden = lm.model.norm(lm.token_embeddings(ids)).to('cpu', torch.float64)   # (n, H)
        basis = hidden.T                                                             # (H, n)
        solve = torch.linalg.pinv(basis)                                             # (n, H)
        targets = torch.zeros(lm.lm_head.weight.shape[0], len(chain) - 1, dtype=torch.float64)
        targets[chain[1:], torch.arange(len(chain) - 1)] = CHAIN_LOGIT                # (V, n)
        head = lm.lm_head.weight.to('cpu', torch.float64)                            # (V, H)
        eye = torch.eye(basis.shape[0], dtype=torch.float64)
        head = targets @ solve + head @ (eye - basis @ solve)
        lm.lm_head.weight.copy_(head.to(lm.lm_head.weight.dtype))


def chain_margin(model: Pi0Fast, start_token: int, frame) -> float:
    """The smallest margin, over the chain, of the next token's logit above the best other
    one, from the embeddings alone (what ``make_decodable_`` set; a check)."""
    lm = model.language_model
    chain = [int(start_token), *(int(t) for t in frame)]
    with torch.no_grad():
        ids = torch.tensor(chain[:-1], device=lm.lm_head.weight.device)
        logits = lm.logits(lm.model.norm(lm.token_embeddings(ids))).to(torch.float64)
    margins = []
    for row, target in zip(logits, chain[1:]):
        others = torch.cat([row[:target], row[target + 1:]])
        margins.append(float(row[target] - others.max()))
    return float(np.min(margins))


__all__ = ['CHAIN_LOGIT', 'EMBED_GAIN', 'chain_frame', 'chain_margin', 'make_decodable_']
