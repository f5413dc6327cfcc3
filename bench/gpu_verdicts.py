"""The GPU targets, read off a folder of recorded results: one table of verdicts.

    python bench/gpu_verdicts.py bench/results/h200/20261126-suite

Reads every ``gpu-*.json`` written by bench/gpu.py under the folder (recursively) and every
``log-*tests*.txt`` written by bench/gpu_suite.sh, and prints, for each target that the files
hold data for, the measured value, the target and met / missed. A target that no finished
record holds is read from the progress files (``rows-*.json``, bench/gpu_progress.py) of runs
cut short by their time limit, and says so. The targets:

- one robot whose frames repeat (paced part, 1 robot, ``frames that repeat`` rows): the best
  p50 over one robot's floor (vision + prompt + one prefill, measured in the same run),
  target <= 1.3;
- four robots at the paced camera rate (paced part, the default configuration's rows): the
  best row by least-answered robot, target every robot >= 99 % answered and p99 <= 60 ms;
- AR ms per action (table rows of mode ``ar``, CUDA graphs on, one stream, the lowest),
  target <= 35 on an H200, <= 45 on other devices (the H100's);
- the bf16 decode floor (floor part): a graphed decode forward over its weight bytes at the
  copy bandwidth measured in the same run, target <= 1.3;
- FP8 (fp8 part): action tokens within 1 bin of the model dtype's, target >= 99 %, and the
  prefill and one-row decode pieces' fp8 / model-dtype time, target <= 0.65 each (the step
  time ratio per mode is reported);
- the reasoning step (``reasoning-*.json`` of bench/gpu_reasoning.py): the default
  configuration's (pipeline_spec) p50 ms per step over AR's, target <= 0.25;
- pi0-FAST (``pi0fast-*.json`` of bench/gpu_pi0fast.py): the default configuration's
  (pipeline_spec) ms per chunk over the compiled transformers baseline's (it stops at the
  codec's end marker, as the engine does), target <= 0.25;
- the GPU test logs: passed / failed / skipped per log, target no failure.

A target with no data in the folder is listed as "not measured". Thresholds are the issue's;
the files are the record, this script only reads them.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

from gpu_progress import progress_record

ONE_ROBOT_MAX_OVER_FLOOR = 1.3
FLEET_ROBOTS = 4
FLEET_MIN_ANSWERED = 0.99
FLEET_MAX_P99_MS = 60.0
AR_MAX_MS_PER_ACTION = {'H200': 35.0}      # by the device name's model; others: the H100's
AR_MAX_MS_PER_ACTION_ELSEWHERE = 45.0
DECODE_MAX_OVER_FLOOR = 1.3
FP8_MIN_WITHIN_ONE_BIN = 0.99
FP8_MAX_PIECE_RATIO = 0.65
FP8_PIECES = ('prefill', 'decode_1')
REASONING_MAX_OVER_AR = 0.25
PI0FAST_MAX_OVER_COMPILED = 0.25


def _verdict(ok: bool | None) -> str:
    return 'not measured' if ok is None else ('met' if ok else 'missed')


def one_robot(records: list[dict]) -> tuple[str, bool | None]:
    best = None
    for record in records:
        paced = record.get('paced') or {}
        for row in paced.get('rows', []):
            if row.get('robots_n') == 1 and row.get('frames') == 'repeat' \
                    and math.isfinite(row.get('p50_over_floor', math.nan)):
                if best is None or row['p50_over_floor'] < best[0]:
                    best = (row['p50_over_floor'], row, paced['floor_ms'])
    if best is None:
        return 'no paced one-robot row on frames that repeat', None
    ratio, row, floor = best
    return (f'{row["label"]}: p50 {row["worst_p50_ms"]:.1f} ms = {ratio:.2f}x the floor '
            f'{floor:.2f} ms (target <= {ONE_ROBOT_MAX_OVER_FLOOR})',
            ratio <= ONE_ROBOT_MAX_OVER_FLOOR)


def fleet(records: list[dict]) -> tuple[str, bool | None]:
    rows = [row for record in records for row in (record.get('paced') or {}).get('rows', [])
            if row.get('robots_n') == FLEET_ROBOTS and row.get('mode') == 'pipeline_spec'
            and 'error' not in row]
    if not rows:
        return f'no paced row of {FLEET_ROBOTS} robots', None
    best = max(rows, key=lambda r: (r['least_answered'], -r['worst_p99_ms']))
    ok = best['least_answered'] >= FLEET_MIN_ANSWERED and best['worst_p99_ms'] <= FLEET_MAX_P99_MS
    return (f'best of {len(rows)} rows ({best["label"]}, {best["frames"]}, {best["prefills"]} '
            f'prefills/step): least answered {best["least_answered"]:.1%}, worst p99 '
            f'{best["worst_p99_ms"]:.1f} ms (target >= {FLEET_MIN_ANSWERED:.0%} and <= '
            f'{FLEET_MAX_P99_MS:.0f} ms)', ok)


def ar_target(record: dict) -> tuple[float, str]:
    """(the AR ms-per-action target, the device it is for) of the device a record ran on."""
    device = str((record.get('environment') or {}).get('cuda') or '') or 'a device not recorded'
    return next((ms for model, ms in AR_MAX_MS_PER_ACTION.items()
                 if re.search(rf'\b{model}\b', device)), AR_MAX_MS_PER_ACTION_ELSEWHERE), device


def ar_action(records: list[dict]) -> tuple[str, bool | None]:
    """The row closest to (or furthest under) its own device's target."""
    values = [(row['ms_per_action'] / target, row['ms_per_action'], target, device)
              for record in records for target, device in [ar_target(record)]
              for row in record.get('rows', [])
              if row.get('mode') == 'ar' and row.get('graphs') and row.get('streams', 1) == 1]
    if not values:
        return 'no one-stream ar table row with graphs on', None
    _, ms, target, device = min(values)
    return (f'{ms:.1f} ms per action (best of {len(values)} rows against its target; target '
            f'<= {target:.0f} on {device})', ms <= target)


def decode_floor(records: list[dict]) -> tuple[str, bool | None]:
    """The newest floor part: the graphed bf16 decode forward over its weight-streaming time."""
    parts = [record['decode_floor'] for record in records
             if 'decode_over_floor' in (record.get('decode_floor') or {})]   # not a CPU run's
    if not parts:
        return 'no floor part on a GPU', None
    part = parts[-1]
    ratio = part['decode_over_floor']
    return (f'decode {part["decode_ms_graphs_on"]:.2f} ms = {ratio:.2f}x streaming '
            f'{part["bytes"] / 1e9:.1f} GB at {part["copy_GBps"]:.0f} GB/s '
            f'({part["floor_ms"]:.2f} ms; target <= {DECODE_MAX_OVER_FLOOR})',
            ratio <= DECODE_MAX_OVER_FLOOR)


def fp8(records: list[dict]) -> tuple[str, bool | None]:
    parts = [record['fp8'] for record in records if record.get('fp8')]
    if not parts:
        return 'no fp8 part', None
    part = parts[-1]
    bins = part['bin_distance']
    within = (bins['0'] + bins['1']) / bins['tokens']
    ratios = ', '.join(f'{mode} {ratio:.2f}' for mode, ratio in part['step_ms_ratio'].items())
    pieces = {name: ratio for name, ratio in fp8_piece_ratios(part).items()
              if name in FP8_PIECES}
    faithful = within >= FP8_MIN_WITHIN_ONE_BIN
    if set(pieces) == set(FP8_PIECES):
        ok = faithful and all(r <= FP8_MAX_PIECE_RATIO for r in pieces.values())
    else:
        ok = False if not faithful else None         # the speed half was not measured
    piece_text = ', '.join(f'{name} {r:.2f}' for name, r in pieces.items()) or 'none recorded'
    return (f'{within:.2%} of {bins["tokens"]} action tokens within 1 bin (target >= '
            f'{FP8_MIN_WITHIN_ONE_BIN:.0%}); fp8 / model dtype by piece: {piece_text} (target '
            f'<= {FP8_MAX_PIECE_RATIO} each); step time: {ratios}', ok)


def fp8_piece_ratios(part: dict) -> dict:
    """fp8 / model dtype per piece: the part's own ratios (bench/gpu_parts.py), or, in records
    written before it kept them, from the two sides' piece times."""
    if 'fp8' in part.get('pieces_ratio', {}):
        return part['pieces_ratio']['fp8']
    sides = part.get('sides', {})
    if 'auto' not in sides or 'fp8' not in sides:
        return {}
    base, fast = sides['auto']['pieces_ms'], sides['fp8']['pieces_ms']
    return {name: fast[name] / base[name] for name in base if name in fast}


def _newest_ratio(records: list[dict], row: str, against: str, key: str):
    """(record, value of ``row``, value of ``against``, their ratio) of ``key`` in the newest
    record holding both rows (a row is named by its label up to " ("), or None."""
    for record in reversed(records):
        rows = {r['label'].split(' (')[0]: r for r in record.get('rows', [])}
        if row in rows and against in rows:
            value, base = rows[row][key], rows[against][key]
            return record, value, base, value / base
    return None


def reasoning_step(records: list[dict]) -> tuple[str, bool | None]:
    """The default's p50 per reasoning step over AR's, in the newest record holding both. The
    target presumes drafts accepted at the embedded reasoning model's rate: a record whose
    default row left the chains its oracle drafted (bf16 ties on a plain random model make it
    do) measured the bench, not the engine, and gives no verdict. Records from before the
    drafted chains' agreement was recorded are read by the agreement with the eager reference
    (what was drafted then, or close to it); older ones were checked token-equal."""
    found = _newest_ratio(records, 'pipeline_spec', 'ar', 'latency_p50_ms')
    if found is None:
        return 'no reasoning part', None
    record, value, base, ratio = found
    text = (f"default p50 {value:.1f} ms per step against AR's {base:.1f} ({ratio:.3f} x AR; "
            f'target <= {REASONING_MAX_OVER_AR}; {record.get("tokens_per_step")} tokens per '
            'step)')
    row = next(r for r in record['rows'] if r['label'].split(' (')[0] == 'pipeline_spec')
    against = 'the drafted tokens' if 'drafted_prefix' in row else "the eager reference's"
    followed = row.get('drafted_prefix', row.get('shared_prefix', 1.0))
    if followed < 1.0:
        gained = record.get('tokens_per_step', 0) / row['forwards_per_action']
        meant = (record.get('args') or {}).get('tokens_per_forward', float('nan'))
        return (f'{text}; but {gained:.1f} tokens per verifier forward where the oracle was set '
                f'for {meant:g}: the row follows {followed:.0%} of {against} before the first '
                "difference, not the engine's speed", None)
    return text, ratio <= REASONING_MAX_OVER_AR


def pi0fast_chunk(records: list[dict]) -> tuple[str, bool | None]:
    """The default's ms per chunk over the compiled baseline's, in the newest record with both;
    beside it, where recorded, the oracle rows' projection to a trained model's acceptance
    (the verdict stays the measured default's)."""
    found = _newest_ratio(records, 'pipeline_spec', 'hf compiled', 'ms_per_chunk')
    if found is None:
        return 'no pi0fast part with a compiled baseline', None
    record, value, base, ratio = found
    text = (f'default {value:.1f} ms per chunk against HF compiled {base:.1f} ({ratio:.3f} x; '
            f'target <= {PI0FAST_MAX_OVER_COMPILED}; {record.get("tokens")} tokens)')
    oracle = next((r for r in record['rows']
                   if r['label'].startswith('pipeline_spec oracle')), None)
    if oracle is not None:
        text += (f'; {oracle["label"]} on decisive weights: {oracle["ms_per_chunk"]:.1f} ms '
                 f'({oracle["ms_per_chunk"] / base:.3f} x compiled) at '
                 f'{oracle["acceptance_length"]:.2f} tokens per verifier forward')
    return text, ratio <= PI0FAST_MAX_OVER_COMPILED


TEST_SUMMARY = re.compile(r'^(?:=+ )?((?:\d+ (?:passed|failed|skipped|errors?|deselected)'
                          r'(?:, )?)+)(?: in [\d.]+s)?', re.MULTILINE)


def test_logs(folder: Path) -> list[tuple[str, str, bool | None]]:
    out = []
    for log in sorted(folder.rglob('log-*tests*.txt')):
        matches = TEST_SUMMARY.findall(log.read_text(errors='replace'))
        if not matches:
            out.append((str(log.relative_to(folder)), 'no pytest summary', None))
            continue
        counts = {name: int(n) for n, name in re.findall(r'(\d+) (\w+)', matches[-1])}
        failed = counts.get('failed', 0) + counts.get('error', 0) + counts.get('errors', 0)
        out.append((str(log.relative_to(folder)), matches[-1].rstrip(', '), failed == 0))
    return out


def from_records_or_progress(target, records: list[dict], progress: list[dict]):
    """``target`` over the finished records; where they hold nothing for it, over the progress
    files of runs cut short (marked as such)."""
    measured, ok = target(records)
    if ok is None and progress:
        partial, partial_ok = target(progress)
        if partial_ok is not None:
            return f'{partial} [from a run cut short]', partial_ok
    return measured, ok


def verdicts(folder: Path) -> list[tuple[str, str, bool | None]]:
    records = [json.loads(p.read_text()) for p in sorted(folder.rglob('gpu-*.json'))]
    progress, unreadable = [], []
    for path in sorted(folder.rglob('rows-*.json')):
        # A file that does not parse (written by an older bench/gpu.py, cut mid-write) is
        # listed as skipped rather than failing every verdict.
        try:
            progress.append(progress_record(json.loads(path.read_text())))
        except (ValueError, KeyError, TypeError) as exc:
            unreadable.append(f'{path.relative_to(folder)} ({type(exc).__name__})')
    # A progress file records no device: a run cut short ran on the device of the finished
    # records beside it, where they agree on one.
    devices = {(r.get('environment') or {}).get('cuda') for r in records} - {None}
    if len(devices) == 1:
        environment = {'cuda': devices.pop()}
        for record in progress:
            record.setdefault('environment', environment)
    rows = [(name, *from_records_or_progress(target, records, progress)) for name, target in
            (('one robot, frames that repeat', one_robot),
             (f'{FLEET_ROBOTS} robots at the paced camera rate', fleet),
             ('AR per action', ar_action),
             ('bf16 decode over its weight streaming', decode_floor),
             ('FP8 fidelity and speed', fp8))]
    reasoning = [json.loads(p.read_text()) for p in sorted(folder.rglob('reasoning-*.json'))]
    rows.append(('reasoning step (ECoT shape)', *reasoning_step(reasoning)))
    pi0fast = [json.loads(p.read_text()) for p in sorted(folder.rglob('pi0fast-*.json'))]
    rows.append(('pi0-FAST against the compiled baseline', *pi0fast_chunk(pi0fast)))
    rows += [(f'tests: {name}', summary, ok) for name, summary, ok in test_logs(folder)]
    rows += [('progress file', f'{name}: unreadable, skipped', None) for name in unreadable]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('folder', help='a results folder of bench/gpu_suite.sh (searched '
                        'recursively: a run\'s parent folder gives its commands together)')
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    if not folder.is_dir():
        print(f'{folder}: not a folder', file=sys.stderr)
        return 2
    print('| target | measured | verdict |\n|---|---|---|')
    for name, measured, ok in verdicts(folder):
        print(f'| {name} | {measured} | {_verdict(ok)} |')
    return 0


if __name__ == '__main__':
    sys.exit(main())
