"""A test aid: random ECoT weights whose greedy decoding writes a reasoning, then an action.

A random-weight model never writes ``ACTION:``: every frame runs out its text budget and is
refused, so nothing about a reasoning policy's steady state (reasoning that mostly repeats,
an action after it, drafts accepted) can be tried without a trained checkpoint. ``vla-spec
make-checkpoint ecot-tiny --scripted-reasoning`` writes a random model with a script in its
language model, in the manner of pi0-FAST's decodable chunks (models/pi0fast/decodable.py):

1. the script: the first occurrence of each token of a sample ECoT reasoning (ECoT's tags and
   words, as the checkpoint's tokenizer writes them; ``MAX_TEXT_TOKENS`` of them), after the
   prompt's last token, then the ``ACTION:`` marker and the "▁" token; at every
   ``BRANCH_EVERY``-th text token a second, otherwise unused token is an equally likely
   successor that rejoins the script after it (a word that changes between frames);
2. the action ids share one embedding, and after "▁" and after every action id all 256
   action ids are equally likely: which bin wins is the layers' business;
3. the token embeddings are scaled by ``EMBED_GAIN`` and the LM head is solved (least
   squares, exact for fewer states than the hidden size) to give ``CHAIN_LOGIT`` to each
   state's successors and about 0 to every other token.

Greedy decoding then writes about 40 tokens of reasoning, ``ACTION:``, "▁" and 7 action
bins. The branch words and the bins are decided by what the layers add; on ``ecot-tiny`` that
barely moves with the image, so expect the same output for nearly every observation (as
pi0-FAST's decodable chunks). It is not a policy: the actions mean nothing. What it gives the
tests: frames that end with an action before the budget, an action part for relaxed
acceptance, and outputs that repeat for lookup drafting. ``scripted_margin`` checks the script.
"""
from __future__ import annotations

import torch

from .reasoning_text import ACTION_TAG

EMBED_GAIN = 64.0
CHAIN_LOGIT = 30.0
MAX_TEXT_TOKENS = 40
BRANCH_EVERY = 5


def script_tokens(prompt, text: str, first_action_id: int) -> tuple[list[int], dict]:
    """-> (the text tokens in order, {state token: its successors}) for ``text`` (module
    docstring, step 1), ending with the marker and the "▁" token (their successors: the
    action, added by ``script_reasoning_``)."""
    start = prompt.encode('put the cup on the plate')[-1]
    reserved = {start, prompt.space_id, prompt.eos_id, prompt.bos_id, *prompt.marker_ids()}
    body = text.split(ACTION_TAG)[0]
    ids = prompt.tokenizer.encode(body, add_special_tokens=False).ids
    text_ids = []
    for token in ids:
        if token not in reserved and token not in text_ids and token < first_action_id:
            text_ids.append(token)
    text_ids = text_ids[:MAX_TEXT_TOKENS]
    unused = [t for t in range(3, first_action_id)
              if t not in reserved and t not in text_ids and prompt.tokenizer.id_to_token(t)]
    successors, previous = {}, start
    for i, token in enumerate(text_ids):
        successors.setdefault(previous, []).append(token)
        if i % BRANCH_EVERY == BRANCH_EVERY - 1 and i + 1 < len(text_ids) and unused:
            alternate = unused.pop()
            successors[previous].append(alternate)
            successors[alternate] = [text_ids[i + 1]]
        previous = token
    chain = [previous, *prompt.marker_ids(), prompt.space_id]
    for state, following in zip(chain, chain[1:]):
        successors[state] = [following]
    return text_ids, {k: tuple(v) for k, v in successors.items()}


def script_reasoning_(model, prompt, text: str) -> dict:
    """Set ``model``'s embeddings and head so that greedy decoding follows the script of
    ``text`` (module docstring); returns the successors map (action ids excluded)."""
    codec = model.action_codec().inner
    first, last = codec.first_action_id, codec.last_action_id
    _, successors = script_tokens(prompt, text, first)
    lm = model.language_model
    action_ids = list(range(first, last + 1))
    with torch.no_grad():
        weight = lm.model.embed_tokens.weight
        weight[first:last + 1] = weight[first].clone()          # one embedding for all bins
        weight.mul_(EMBED_GAIN)
        states = list(successors) + [prompt.space_id, first]
        states = list(dict.fromkeys(states))
        targets = torch.zeros(lm.lm_head.weight.shape[0], len(states), dtype=torch.float64)
        for column, state in enumerate(states):
            following = successors.get(state, ())
            if state == prompt.space_id or state == first:
                following = action_ids
            targets[list(following), column] = CHAIN_LOGIT
        ids = torch.tensor(states, device=weight.device)
        hidden = lm.model.norm(lm.token_embeddings(ids)).to('cpu', torch.float64)   # (n, H)
        basis = hidden.T                                                             # (H, n)
        solve = torch.linalg.pinv(basis)                                             # (n, H)
        head = lm.lm_head.weight.to('cpu', torch.float64)                            # (V, H)
        eye = torch.eye(basis.shape[0], dtype=torch.float64)
        head = targets @ solve + head @ (eye - basis @ solve)
        lm.lm_head.weight.copy_(head.to(lm.lm_head.weight.dtype))
    return successors


def scripted_margin(model, successors: dict) -> float:
    """The smallest margin, over the script's states, of its successors' logit above the best
    other token, from the embeddings alone (a check of ``script_reasoning_``)."""
    lm = model.language_model
    states = list(successors)
    with torch.no_grad():
        ids = torch.tensor(states, device=lm.lm_head.weight.device)
        logits = lm.logits(lm.model.norm(lm.token_embeddings(ids))).to(torch.float64)
    margins = []
    for row, state in zip(logits, states):
        wanted = list(successors[state])
        others = row.clone()
        others[wanted] = float('-inf')
        margins.append(float(row[wanted].min() - others.max()))
    return min(margins)


__all__ = ['BRANCH_EVERY', 'CHAIN_LOGIT', 'EMBED_GAIN', 'MAX_TEXT_TOKENS', 'script_reasoning_',
           'script_tokens', 'scripted_margin']
