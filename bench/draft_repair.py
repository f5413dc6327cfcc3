"""Could a better exact draft decide a frame in fewer verifier forwards? An offline check.

With speculative prefill and the previous action as the draft, a frame whose action repeats
is decided by the one forward that prefills it. A frame whose action changes at position i
costs at least one more forward: the prefill's rows after i were computed on the wrong token.
This script counts, exactly (real forwards of the embedded model, greedy tokens checked against
AR), the verifier forwards per action of three drafts along the scripted expert's path
(held-out seeds, consecutive control steps):

- ``previous``: after a rejection the draft goes on with the previous action (the engine's
  rule);
- ``repair``: after a rejection the draft goes on with the verifier's own argmax at the rows
  beyond the rejected token (computed in the same forward, conditioned on the wrong token:
  Jacobi-style), then the previous action;
- ``both``: the two chains side by side in one tree, the longer accepted path wins;
- ``history``: the stream's last ``--history`` distinct actions side by side in one tree (those
  that agree with the tokens decided so far), the longest accepted path wins, with ``repair``'s
  rule after a rejection: a robot that returns to an action it took a few steps ago.

    python bench/draft_repair.py [--steps 40] [--seed 5] [--history 4]

The last row is the engine itself (``spec`` in its default configuration: the previous action
drafted, speculative prefill) on the same frames, counted by ``Engine.num_verifier_forwards``:
it must match ``previous``, the rule it implements.

Needs the simulator (bash scripts/install.sh sim). Each verification is simulated by a dense
forward over prompt + decided tokens + draft (no engine, no ring): what the engine's tree
verification computes, without its cost.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DRAFTS = ('previous', 'repair', 'both', 'history')


@torch.no_grad()
def greedy_after_each_prefix(runner, prompt, chain: list[int]) -> list[int]:
    """The verifier's greedy token for action positions 0 .. len(chain), position j given
    prompt + chain[:j] (one causal forward in a private cache)."""
    from vla_spec_ros.engine.ar import causal_batch
    length = prompt.shape[0]
    embeds = prompt if not chain else torch.cat(
        [prompt, runner.embed_tokens(torch.tensor(chain, device=prompt.device))], 0)
    cache = runner.new_cache(embeds.shape[0])
    hidden = runner.forward(embeds, causal_batch(0, embeds.shape[0], runner.device), cache)
    rows = hidden[length - 1:]
    return [int(runner.greedy(rows[i:i + 1], False)) for i in range(rows.shape[0])]


def verify_rounds(runner, prompt, previous: list[int], draft_kind: str,
                  history: tuple = ()) -> tuple[int, list]:
    """(verifier forwards, decided tokens) for one frame with ``previous`` as the first draft
    (the prefill's chain) and ``draft_kind``'s rule after each rejection; ``history`` holds
    the stream's earlier distinct actions (the ``history`` draft)."""
    num_tokens = len(previous)
    decided: list[int] = []
    draft = list(previous)
    forwards = 0
    while len(decided) < num_tokens:
        forwards += 1
        start = len(decided)
        chains = [draft[start:]]
        if draft_kind == 'both' and draft[start:] != previous[start:]:
            chains.append(list(previous[start:]))
        if draft_kind == 'history':
            chains += [list(old[start:]) for old in history if list(old[:start]) == decided
                       and list(old[start:]) not in chains]
        best = None
        for chain in chains:
            greedy = greedy_after_each_prefix(runner, prompt, decided + chain)[start:]
            accepted = 0
            while accepted < len(chain) and chain[accepted] == greedy[accepted]:
                accepted += 1
            new = chain[:accepted] + greedy[accepted:accepted + 1]
            if best is None or len(new) > len(best[0]):
                best = (new, greedy[accepted + 1:])     # rows beyond the rejected token
        new, beyond = best
        decided = (decided + new)[:num_tokens]
        rest = list(beyond) if draft_kind in ('repair', 'both', 'history') else []
        rest += previous[len(decided) + len(rest):]
        draft = decided + rest[:num_tokens - len(decided)]
    return forwards, decided


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=40, help='control steps per task')
    parser.add_argument('--seed', type=int, default=5)
    parser.add_argument('--history', type=int, default=4,
                        help='distinct earlier actions in the history draft\'s tree')
    args = parser.parse_args(argv)

    from vla_spec_ros.engine.ar import decode_ar
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.frames import HELD_OUT_SEED, sim_frames
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    policy = VLAPolicy.from_pretrained('metaworld-demo', device='cpu', dtype='float32')
    runner = policy.engine.runner
    num_tokens = runner.max_action_tokens
    forwards = {kind: [] for kind in DRAFTS}
    forwards['engine (spec, default)'] = []
    engine = VLAPolicy.from_pretrained('metaworld-demo', device='cpu', dtype='float32',
                                       mode='spec').engine
    for task in DEFAULT_TASK_NAMES:
        frames = sim_frames([task], args.steps, runner.cfg.image_size,
                            seed=HELD_OUT_SEED + args.seed, stride=1,
                            unnorm_key=policy.unnorm_keys[0])
        previous, history = None, []
        engine.reset()
        for frame in frames:
            before = engine.num_verifier_forwards
            engine.submit(frame)
            (finished,) = engine.run_until_idle()
            if previous is not None:
                forwards['engine (spec, default)'].append(engine.num_verifier_forwards - before)
            prompt = runner.prepare_prompt(frame, policy.config).embeds
            reference, _ = decode_ar(runner, prompt, num_tokens)
            if list(finished.result.tokens) != list(reference):
                raise RuntimeError(f'engine: {finished.result.tokens} != AR {reference}')
            if previous is not None:
                for kind in DRAFTS:
                    count, tokens = verify_rounds(runner, prompt, previous, kind,
                                                  tuple(history[1:]))
                    if tokens != reference:
                        raise RuntimeError(f'{kind}: {tokens} != AR {reference}')
                    forwards[kind].append(count)
            previous = reference
            if reference in history:          # most recent first, distinct
                history.remove(reference)
            history = [reference] + history[:args.history - 1]
    print(f'`python bench/draft_repair.py --steps {args.steps} --seed {args.seed} '
          f'--history {args.history}`: '
          f'{len(forwards["previous"])} consecutive frames, every draft gave the AR tokens\n')
    print('| draft | verifier forwards / action | decided by one forward | '
          'forwards: 1 / 2 / 3 / 4+ |')
    print('|---|---|---|---|')
    for kind, counts in forwards.items():     # the engine's row last
        counts = np.array(counts)
        shares = [np.mean(counts == n) for n in (1, 2, 3)] + [np.mean(counts >= 4)]
        print(f'| {kind} | {counts.mean():.2f} | {np.mean(counts == 1):.0%} | '
              + ' / '.join(f'{s:.0%}' for s in shares) + ' |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
