"""The demo's files: the record as strict JSON (null where nothing was measured), a Markdown
report and the plots (matplotlib optional: without it, no plots)."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from vla_spec_ros.harness.demo_placement import (curve_rate, delay_curve, measured,
                                                 model_curves, placements,
                                                 reference_placements, stream_placements)
from vla_spec_ros.harness.demo_report import format_report
from vla_spec_ros.harness.demo_tables import REFERENCE_7B_TITLE, WHERE_MODEL

# OpenVLA-7B latencies recorded on an H100 (bench/README.md, "Current code, graphs on"), placed
# on the demo's delay curve for scale; the file ships in the repository, and the demo copies
# the rows below into its record (so `--report` needs no file).
REFERENCE_7B_FILE = 'bench/results/h100/20261123-final2/gpu-openvla-7b-cuda-20261123-093348.json'
# (mode in that file, CUDA graphs, label, latency field, what that latency is)
REFERENCE_7B_ROWS = (
    ('hf', False, 'HF eager', 'latency_p50_ms',
     'p50 per frame (transformers generate, as OpenVLA ships)'),
    ('hf_compiled', False, 'HF compiled', 'latency_p50_ms',
     'p50 per frame (StaticCache + torch.compile)'),
    ('ar', True, 'ar (this engine)', 'ms_per_action',
     'ms per action, one at a time (its p50 in that table, {p50:.0f} ms, includes a frame '
     'waiting behind the previous one)'),
    ('pipeline_spec@3.0', True, 'pipeline_spec (this engine, draft accepted 3 tokens/forward)',
     'latency_p50_ms', 'p50, camera faster than inference'),
)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use('Agg')
        import matplotlib.pyplot as plt
    except ImportError:
        print('matplotlib is not installed: skipping the plots (pip install matplotlib)')
        return None
    return plt


def plot_delay(path: Path, record: dict, plt) -> None:
    """Left: success against delay, with each mode placed at one rate (`curve_rate`): by its
    streaming latency on the node (HF: model only), and the recorded OpenVLA-7B latencies;
    without a stream part, by model-only and lock-step latency. Right: the success each mode's
    model-only latency implies at every rate measured."""
    curve = delay_curve(record)
    places = placements(record)
    fig, (ax, ax_rate) = plt.subplots(1, 2, figsize=(14, 6.8),
                                      gridspec_kw={'width_ratios': [3, 2]})
    styles = {'every': ('o-', 'every frame answered (pipelined)'),
              'one_in_flight': ('s--', 'one frame in flight')}
    curves = model_curves(record)
    for frames, (style, label) in styles.items():
        points = sorted(curve[frames].items())
        if points:
            ax.plot([d for d, _ in points], [s for _, s in points], style, color='gray'
                    if frames == 'one_in_flight' else 'black',
                    label=label if len(curves) == 1 else f'{curves[0][0]}, {label}')
    for i, (model, other) in enumerate(curves[1:]):       # --delay-models: the others
        for frames, (style, label) in styles.items():
            points = sorted(other[frames].items())
            if points:
                ax.plot([d for d, _ in points], [s for _, s in points], style,
                        color=('tab:red', 'tab:purple', 'tab:olive')[i % 3],
                        alpha=0.6 if frames == 'one_in_flight' else 1.0,
                        label=f'{model}, {label}')
    modes = list(dict.fromkeys([p['mode'] for p in places]
                               + [p['mode'] for p in stream_placements(record)]))
    color = {mode: f'C{i}' for i, mode in enumerate(modes)}
    rate = curve_rate(record)
    streamed = stream_placements(record)
    if streamed:
        for i, p in enumerate(streamed):
            on_node = p['where'] != WHERE_MODEL
            ax.plot(p['delay'] + (i - len(streamed) / 2) * 0.06, measured(p['success']),
                    '^' if on_node else 'v', markersize=10, color=color[p['mode']],
                    label=f"{p['label']} ({'node' if on_node else 'model only'}, "
                    f"{p['latency_p50_ms']:.0f} ms)")
        title = (f'Placed at {rate:g} Hz (1 period = {1e3 / rate:.0f} ms) by streaming '
                 'latency: ^ on the node, v model only')
    elif rate is not None:
        for i, p in enumerate(q for q in places if q['rate_hz'] == rate):
            for source, marker in (('model', 'v'), ('node', '^')):
                s = p.get(source)
                if s is None or math.isnan(measured(s['success'])):
                    continue
                ax.plot(s['delay'] + (i - len(modes) / 2) * 0.05, s['success'], marker,
                        markersize=9, color=color[p['mode']], label=f"{p['mode']} ({source}, "
                        f"{s['latency_p50_ms']:.0f} ms)")
        title = (f'Modes placed at {rate:g} Hz (1 period = {1e3 / rate:.0f} ms): v model '
                 'only, ^ on the node (lock-step)')
    reference = reference_placements(record)
    for i, p in enumerate(reference):
        ax.plot(p['delay'] + (i - len(reference) / 2) * 0.06, measured(p['success']), '*',
                markersize=13, markerfacecolor='none', color=f'C{len(modes) + i}',
                label=f"7B H100 recorded: {p['label']} ({p['latency_p50_ms']:.0f} ms)")
    if rate is not None:
        if reference:
            title += f'\n* OpenVLA-7B, {REFERENCE_7B_TITLE}'
        ax.set_title(title, fontsize=9)
    ax.set(xlabel='action delay d (control periods)', ylabel='success rate',
           ylim=(-0.05, 1.05))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc='upper center', bbox_to_anchor=(0.5, -0.12), ncol=2)
    for i, mode in enumerate(modes):      # equal values would hide a line: small offsets
        rows = sorted((p for p in places if p['mode'] == mode and 'model' in p),
                      key=lambda p: p['rate_hz'])
        if rows:
            offset = (i - len(modes) / 2) * 0.006
            successes = [measured(p['model']['success']) + offset for p in rows]
            ax_rate.plot([p['rate_hz'] for p in rows], successes, 'osD^v<>'[i % 7] + '-',
                         color=color[mode], label=mode, alpha=0.85)
    ax_rate.set(xlabel='control rate (Hz)', ylabel='success rate on the delay curve',
                ylim=(-0.05, 1.05))
    ax_rate.set_title('What each mode\'s model-only latency implies', fontsize=10)
    ax_rate.grid(alpha=0.3)
    if ax_rate.get_lines():
        ax_rate.legend(fontsize=8, loc='lower left')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_relax(path: Path, record: dict, plt) -> None:
    points = sorted(record['relax']['points'], key=lambda p: p['point']['relax_threshold'])
    rs = [p['point']['relax_threshold'] for p in points]
    xs = list(range(len(rs)))              # r values are spread unevenly: categorical axis
    fig, (ax_acc, ax_succ, ax_hist) = plt.subplots(1, 3, figsize=(15, 4.2))
    ax_acc.plot(xs, [measured(p['acceptance_length']) for p in points], 'o-', color='C0',
                label='acceptance length')
    ax_acc.set_ylabel('acceptance length (tokens / verifier forward)', color='C0')
    ax_fwd = ax_acc.twinx()
    ax_fwd.plot(xs, [measured(p['forwards_per_action']) for p in points], 's--', color='C1',
                label='forwards per action')
    ax_fwd.set_ylabel('verifier forwards per action', color='C1')
    ax_succ.plot(xs, [p['success_rate'] for p in points], 'o-', color='C2')
    ax_succ.set(ylabel='success rate', ylim=(-0.05, 1.05))
    for ax in (ax_acc, ax_succ):
        ax.set_xticks(xs, [str(r) for r in rs])
        ax.set_xlabel('relaxation threshold r (bins)')
        ax.grid(alpha=0.3)
    tree = record['relax']['tree']
    ax_acc.set_title(f"spec, draft tree depth {tree[0]}, top-k {tree[1]}", fontsize=10)
    ax_succ.set_title('success rate', fontsize=10)
    # |bin(relaxed) - bin(AR)| per action dimension, at the largest r.
    widest = points[-1]
    counts = widest['bin_distance_counts']
    if counts:
        edges = [0, 1, 2, 3, 5, 9, 17, 33, 10 ** 6]
        names = ['0', '1', '2', '3-4', '5-8', '9-16', '17-32', '>32']
        width = 0.8 / len(counts)
        for dim, c in enumerate(counts):
            total = sum(c) or 1
            shares = [sum(c[lo:hi]) / total for lo, hi in zip(edges[:-1], edges[1:])]
            ax_hist.bar([i + (dim - len(counts) / 2 + 0.5) * width for i in range(len(names))],
                        shares, width, label=f'dim {dim}')
        ax_hist.set_xticks(range(len(names)), names)
        ax_hist.set_yscale('log')
        ax_hist.set(xlabel='|bin(relaxed) - bin(AR)| for the same observation',
                    ylabel='share of tokens')
        ax_hist.set_title(f"r = {widest['point']['relax_threshold']}", fontsize=10)
        ax_hist.legend(fontsize=7, ncol=2)
        ax_hist.grid(alpha=0.3, axis='y')
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _nan_to_none(value):
    """NaN (nothing measured) -> None, recursively: strict JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _nan_to_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_nan_to_none(v) for v in value]
    return value


def write_results(out_dir, record: dict, stem: str | None = None) -> dict:
    """`<out>/<stem>.json` (strict: null where nothing was measured), `.md` and the plots;
    returns {kind: path or None}. JSON values that were not measured are null."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / (stem or f'demo-{time.strftime("%Y%m%d-%H%M%S")}')
    paths = {'json': stem.with_suffix('.json'), 'md': stem.with_suffix('.md'),
             'delay_png': None, 'relax_png': None}
    record = _nan_to_none(record)
    paths['json'].write_text(json.dumps(record, indent=2, default=str, allow_nan=False))
    plt = _pyplot() if ('delay' in record or 'relax' in record) else None
    if plt is not None and 'delay' in record:
        paths['delay_png'] = stem.parent / f'{stem.name}-delay.png'
        plot_delay(paths['delay_png'], record, plt)
    if plt is not None and 'relax' in record:
        paths['relax_png'] = stem.parent / f'{stem.name}-relax.png'
        plot_relax(paths['relax_png'], record, plt)
    machine = record['machine']
    md = [f'# vla-spec demo ({record["created"]})', '', f'command: `{record["command"]}`', '']
    if record.get('latencies_from'):
        source = record['latencies_from']
        md += [f'Latencies (stream, speed and lock-step parts) from {source["file"]} '
               f'(`{source["command"]}`, {source["created"]}).', '']
    md += [f'model {record["model"]}, max {record["max_steps"]} steps, seed {record["seed"]}, '
           f'parts {", ".join(record["parts"])}, wall time {record.get("wall_s", 0):.0f} s', '',
           'machine: ' + ', '.join(f'{k} {v}' for k, v in machine.items()), '',
           format_report(record)]
    for kind, title in (('delay_png', 'success against action delay'),
                        ('relax_png', 'relaxation trade-off')):
        if paths[kind] is not None:
            md.append(f'![{title}]({paths[kind].name})\n')
    paths['md'].write_text('\n'.join(md))
    return paths


def reference_7b(root: Path | None = None) -> dict:
    """The REFERENCE_7B_ROWS of REFERENCE_7B_FILE (under `root`, default this checkout), for
    the record; 'rows' is empty with a reason when the file is not there (an installed
    package without the repository)."""
    root = Path(__file__).resolve().parents[2] if root is None else Path(root)
    path = root / REFERENCE_7B_FILE
    out = {'file': REFERENCE_7B_FILE, 'title': REFERENCE_7B_TITLE, 'rows': []}
    if not path.is_file():
        out['missing'] = f'{path} not found (not a repository checkout)'
        return out
    data = json.loads(path.read_text())
    out.update(device=data['environment']['cuda'], dtype=data['dtype'],
               preset=data['preset'], command=data['command'],
               weights='random weights of the OpenVLA-7B shape',
               note='Random weights cannot train a draft head: that run\'s speculative rows '
                    'draft with an oracle chain tuned to 3 accepted tokens per verifier '
                    'forward and costing no draft forward (bench/README.md), not the previous '
                    'action; ar and pipeline_spec ran with CUDA graphs, one stream.')
    for mode, graphs, label, field, kind in REFERENCE_7B_ROWS:
        row = next((r for r in data['rows'] if r['mode'] == mode and r['graphs'] == graphs
                    and r['streams'] == 1), None)
        if row is None:
            raise ValueError(f'{path}: no {mode} row with graphs {graphs}')
        out['rows'].append({'mode': mode.split('@')[0], 'label': label,
                            'latency_ms': row[field],
                            'latency_kind': kind.format(p50=row['latency_p50_ms']),
                            'actions_per_s': row['actions_per_s'],
                            'latency_p50_ms': row['latency_p50_ms']})
    return out


RECORD_KEYS = ('machine', 'created', 'command')     # what every demo record has


def load_record(path) -> dict:
    """A demo record written by `write_results` (its .json); ValueError naming the file when
    it is not JSON or not a demo record."""
    try:
        record = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f'--report {path}: not JSON ({exc}); give the demo\'s .json '
                         'record') from None
    missing = [key for key in RECORD_KEYS
               if not isinstance(record, dict) or key not in record]
    if missing:
        raise ValueError(f'--report {path}: not a demo record (no {", ".join(missing)})')
    return record


def print_report(record: dict, paths: dict | None = None) -> None:
    print()
    print(format_report(record))
    if paths:
        print('results: ' + ', '.join(str(p) for p in paths.values() if p is not None))


__all__ = ['REFERENCE_7B_FILE', 'reference_7b', 'write_results', 'load_record', 'print_report',
           'plot_delay', 'plot_relax']
