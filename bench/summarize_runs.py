"""Median over repeated ``vla-spec bench --out DIR`` runs (the CPU machine is noisy).

    python bench/summarize_runs.py bench/results/cpu/bench-*.json

Groups the runs by their command, prints per mode the median (and min–max) of actions/s, of
the ratio to the HF baseline measured in the same run, and of ms per step / host ms per step;
for a ``--sweep-inflight`` run, the step time at the largest ``max_inflight`` over the step
time at 2, per run, for segment and dense attention.
"""
from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def spread(values) -> str:
    values = [v for v in values if v == v]          # drop NaN
    if not values:
        return '–'
    return f'{np.median(values):.2f} ({min(values):.2f}–{max(values):.2f})'


def summarize(paths: list[str]) -> str:
    by_command = defaultdict(list)
    for path in paths:
        record = json.loads(Path(path).read_text())
        by_command[record['command']].append(record)
    out = []
    for command, records in by_command.items():
        out += [f'`{command}` — {len(records)} runs, median (min–max)', '',
                '| mode | actions/s | ×HF | ms/step | host ms/step |', '|---|---|---|---|---|']
        modes = [row['mode'] for row in records[0]['rows']]
        for mode in modes:
            rows = [r for rec in records for r in rec['rows'] if r['mode'] == mode]
            out.append(f'| {mode} | {spread([r["actions_per_s"] for r in rows])} | '
                       f'{spread([r["ratio_vs_hf"] for r in rows])} | '
                       f'{spread([r["step_ms"] for r in rows])} | '
                       f'{spread([r["host_ms"] for r in rows])} |')
        for backend in ('segments', 'dense'):
            ratios = []
            for rec in records:
                steps = {int(m.group(1)): r['step_ms'] for r in rec['rows']
                         if (m := re.fullmatch(rf'pipeline {backend} max_inflight=(\d+)',
                                               r['mode']))}
                if 2 in steps and len(steps) > 1:
                    ratios.append(steps[max(steps)] / steps[2])
            if ratios:
                out.append(f'\nstep time at the largest max_inflight / at 2 ({backend}): '
                           f'{spread(ratios)}')
        out.append('')
    return '\n'.join(out)


if __name__ == '__main__':
    print(summarize(sys.argv[1:]))
