"""Fidelity of the fast paths in reduced precision: bin distance of every action token against
the HF eager reference on the same weights.

float64 token equality is the correctness proof (the test suite); in bf16 the engine's paths
(packed segments, tree verification, fused kernels, CUDA graphs) sum in other orders than HF
eager, so near-ties between two bins can flip. This measures how often and how far: for each
frame and each of its action tokens, |our token - HF token| (adjacent action tokens are
adjacent bins), histogrammed as 0, 1, 2 and 3+ bins. A token outside the action range on
either side counts as 3+ unless both tokens are equal.
"""
from __future__ import annotations

BUCKETS = ('0', '1', '2', '3+')


def bin_distance_histogram(ours: list, reference: list, first_action_id: int,
                           last_action_id: int) -> dict:
    """Counts of per-token bin distance between two lists of token tuples (frame by frame):
    {'0': n, '1': n, '2': n, '3+': n, 'tokens': total, 'frames_exact': frames all equal}."""
    if len(ours) != len(reference):
        raise ValueError(f'{len(ours)} frames against {len(reference)} reference frames')
    counts = dict.fromkeys(BUCKETS, 0)
    frames_exact = 0
    for got, want in zip(ours, reference):
        if len(got) != len(want):
            raise ValueError(f'token counts differ: {len(got)} vs {len(want)}')
        frames_exact += tuple(got) == tuple(want)
        for a, b in zip(got, want):
            in_range = all(first_action_id <= t <= last_action_id for t in (a, b))
            distance = abs(int(a) - int(b)) if in_range or a == b else 3
            counts[BUCKETS[min(distance, 3)]] += 1
    return {**counts, 'tokens': sum(counts.values()), 'frames_exact': frames_exact,
            'frames': len(ours)}


def format_histogram_rows(results: dict) -> str:
    """Markdown table of {(label): histogram} with shares in percent."""
    lines = ['| path | frames | frames exact | 0 bins | 1 bin | 2 bins | 3+ bins |',
             '|---|---|---|---|---|---|---|']
    for label, h in results.items():
        if isinstance(h, str):
            lines.append(f'| {label} | failed: {h} | | | | | |')
            continue
        share = [100.0 * h[b] / max(h['tokens'], 1) for b in BUCKETS]
        lines.append(f'| {label} | {h["frames"]} | {h["frames_exact"]} | '
                     + ' | '.join(f'{s:.2f} %' for s in share) + ' |')
    return '\n'.join(lines)


def tokens_per_frame(finished: list) -> list:
    """Finished actions (any order) -> token tuples in request-id order; raises on errors."""
    errors = sorted({f.error for f in finished if f.error is not None})
    if errors:
        raise RuntimeError(f'frames failed: {errors}')
    return [tuple(f.result.tokens) for f in sorted(finished, key=lambda f: f.request_id)]
