"""How many FAST frames can an exact draft from the stream's past decide in the prefill?

The default mode's median frame through the node costs its prefill plus one more forward
whenever fewer than half the frames are decided by the prefill (docs/speculation.md). This
bounds what better drafts from the past could do, without running the engine's drafting: AR's
tokens of one robot's consecutive control steps (the validation placements by default), then,
for each frame, whether its whole token sequence is among the chains a draft set would put in
the prefill:

- previous frame: the previous frame's tokens (PreviousActionDrafter's draft);
- shifted chunk: the previous chunk shifted by one control step and re-encoded
  (ShiftedChunkDrafter's draft); the default carries both (the "default" row);
- + older frames: the tokens of frames i-2 and i-3 as well;
- + one coefficient ±1: every chain that changes one integer coefficient of the previous
  chunk by one (2 × H × D chains);
- + oracle first token: the true first action token (which no draft knows), then each
  draft continued by coefficient (codec.continue_draft): a tree branching at the token where
  most misses happen, with a perfect guess there;
- all: every chain above.

Per row: the share of frames decided in the prefill and the prefill rows the set adds (tree
nodes after the shared text prefix, mean per frame). Also: how many of its integer
coefficients a frame's chunk changes against the previous frame's. Model only, no timing.

    python3 bench/prefill_ceiling.py [--model metaworld-demo-fast] [--seed 2000]
        [--frames 345] [--out bench/results/prefill_ceiling]
"""
from __future__ import annotations

import argparse
import collections
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
for path in (ROOT, ROOT / 'bench'):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

OUT = ROOT / 'bench' / 'results' / 'prefill_ceiling'
ROWS = ('previous frame', 'shifted chunk', 'default (both)', '+ older frames',
        '+ one coefficient ±1', '+ oracle first token', 'all')


def coefficients_of(codec, tokens) -> np.ndarray | None:
    """The frame's integer coefficients, or None when its tokens do not decode."""
    fast_ids = [codec.to_fast_id(t) for t in tokens if codec.is_action_token(t)]
    try:
        return codec.tokenizer.decode_coefficients(fast_ids)
    except ValueError:
        return None


def frame_of_coefficients(codec, coefficients) -> tuple[int, ...] | None:
    """The whole frame (prefix, action tokens, suffix, end) spelling `coefficients`, or None
    when the codec cannot spell them."""
    from vla_spec_ros.codecs.fast_tokenizer import coefficients_to_chunk
    p = codec.tokenizer.params
    chunk = coefficients_to_chunk(coefficients, p.action_horizon, p.action_dim, p.scale)
    try:
        frame = tuple(codec.encode(chunk))
    except ValueError:
        return None
    return frame if np.array_equal(coefficients_of(codec, frame), coefficients) else None


def draft_sets(codec, tokens: list, i: int) -> dict:
    """Frame i's candidate chains per ROWS entry (sets of whole frames)."""
    from vla_spec_ros.engine.drafting.shifted_chunk_drafter import shift_chunk
    previous = tokens[i - 1]
    sets = {'previous frame': {previous}, 'shifted chunk': set()}
    decoded = codec.decode(previous)
    if decoded.is_valid:
        sets['shifted chunk'].add(tuple(codec.encode(shift_chunk(decoded.normalized, 1))))
    sets['default (both)'] = sets['previous frame'] | sets['shifted chunk']
    older = {tokens[j] for j in (i - 2, i - 3) if j >= 0}
    sets['+ older frames'] = sets['default (both)'] | older
    perturbed = set()
    coefficients = coefficients_of(codec, previous)
    if coefficients is not None:
        for q in range(len(coefficients)):
            for delta in (1, -1):
                changed = coefficients.copy()
                changed[q] += delta
                frame = frame_of_coefficients(codec, changed)
                if frame is not None:
                    perturbed.add(frame)
    sets['+ one coefficient ±1'] = sets['default (both)'] | perturbed
    current, start = tokens[i], len(codec.prefix_tokens)
    oracle = set()
    if len(current) > start:
        decided = current[:start + 1]
        oracle = {decided + tuple(codec.continue_draft(decided, d))
                  for d in sets['default (both)']}
    sets['+ oracle first token'] = sets['default (both)'] | oracle
    sets['all'] = sets['+ older frames'] | perturbed | oracle
    return sets


def added_rows(chains, num_prefix: int) -> int:
    """Tree nodes the chains put in the prefill after their shared text prefix (a trie)."""
    nodes = set()
    for chain in chains:
        for k in range(num_prefix + 1, len(chain) + 1):
            nodes.add(chain[:k])
    return len(nodes)


def measure(tokens: list, codec) -> dict:
    hits = collections.Counter()
    rows = collections.defaultdict(list)
    changed = collections.Counter()
    num = 0
    for i in range(1, len(tokens)):
        num += 1
        sets = draft_sets(codec, tokens, i)
        for name in ROWS:
            hits[name] += tokens[i] in sets[name]
            rows[name].append(added_rows(sets[name], len(codec.prefix_tokens)))
        a, b = coefficients_of(codec, tokens[i - 1]), coefficients_of(codec, tokens[i])
        if a is None or b is None:
            changed['does not decode'] += 1
        else:
            k = int((a != b).sum())
            changed[str(k) if k < 3 else '3 or more'] += 1
    return {'num_frames': num,
            'rows': [{'draft': name, 'decided_by_prefill': hits[name] / num,
                      'added_rows_mean': float(np.mean(rows[name]))} for name in ROWS],
            'coefficients_changed': {k: v / num for k, v in sorted(changed.items())}}


def format_markdown(record: dict) -> str:
    lines = [f"# Frames an exact draft from the past decides in the prefill ({record['model']}, "
             f"seed {record['seed']}, {record['num_frames']} consecutive frames)", '',
             f"`{record['command']}`", '',
             '| draft chains in the prefill | frames decided by the prefill | prefill rows '
             'added (mean) |', '|---|---|---|']
    for row in record['rows']:
        lines.append(f"| {row['draft']} | {100 * row['decided_by_prefill']:.1f} % | "
                     f"{row['added_rows_mean']:.1f} |")
    lines += ['', '| integer coefficients changed against the previous frame | share of '
              'frames |', '|---|---|']
    for k, v in record['coefficients_changed'].items():
        lines.append(f'| {k} | {100 * v:.1f} % |')
    return '\n'.join(lines) + '\n'


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--model', default='metaworld-demo-fast')
    parser.add_argument('--seed', type=int, default=2000,
                        help='episode seeds of the frames (2000: the validation placements)')
    parser.add_argument('--frames', type=int, default=345)
    parser.add_argument('--out', default=str(OUT))
    args = parser.parse_args(argv)

    from frame_runs import run_frames

    from vla_spec_ros.harness.closed_loop import _resolve_unnorm_key
    from vla_spec_ros.harness.streaming import stream_frames
    from vla_spec_ros.policy import VLAPolicy
    from vla_spec_ros.sim.metaworld_env import DEFAULT_TASK_NAMES

    policy = VLAPolicy.from_pretrained(args.model, mode='ar')
    codec = policy.engine.runner.codec
    if not hasattr(codec, 'tokenizer'):
        parser.error(f'{args.model}: not a FAST-token model')
    unnorm_key = _resolve_unnorm_key(policy, None)
    frames = stream_frames(list(DEFAULT_TASK_NAMES), args.frames,
                           policy.model_config.image_size, args.seed, unnorm_key)
    runs = run_frames(policy, frames, unnorm_key, warmup=0)
    record = {'command': shlex.join(['python3', 'bench/prefill_ceiling.py',
                                     *(argv if argv is not None else sys.argv[1:])]),
              'created': time.strftime('%Y-%m-%d %H:%M:%S'), 'model': args.model,
              'seed': args.seed, **measure([tuple(tokens) for _, _, tokens in runs], codec)}
    text = format_markdown(record)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"prefill_ceiling-{time.strftime('%Y%m%d-%H%M%S')}"
    stem.with_suffix('.json').write_text(json.dumps(record, indent=1))
    stem.with_suffix('.md').write_text(text)
    print(f'written {stem}.json, {stem}.md')
    return 0


if __name__ == '__main__':
    sys.exit(main())
