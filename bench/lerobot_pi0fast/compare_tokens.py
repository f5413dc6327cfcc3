"""π0-FAST tokens of this package against LeRobot's own pi0_fast, frame by frame.

Runs under the project's Python. It

1. takes a pi0-FAST checkpoint folder in LeRobot's layout (``--checkpoint``), or writes one
   with ``vla-spec make-checkpoint --preset pi0fast-tiny``;
2. writes N frames (1..3 random uint8 camera images, a raw robot state, an instruction;
   every fourth frame repeats the one before it, as a robot standing still would) to
   ``frames.npz``, with this package's prompt ids of each frame when the family loads. The
   state is drawn as mean + std * U(-1.2, 1.2) from the checkpoint's state statistics, so that
   both sides normalise it and some values fall outside [-1, 1] (bins -1 and 255);
3. runs ``lerobot_side.py`` under LeRobot's interpreter (``--lerobot-python``, a separate
   Python >= 3.12 environment with ``lerobot[pi]==0.6.1``; offline);
4. runs ``VLAPolicy.from_pretrained(folder, mode=...)`` for each mode (ar, pipeline, spec,
   pipeline_spec; relax_threshold 0) and compares the generated ids with LeRobot's, frame by
   frame: both cut after the first ``|`` (LeRobot stops there; so does this package in the
   LeRobot style, while the openpi style goes on to EOS); where both decode an action chunk,
   the un-normalised actions are compared too;
5. prints a table and writes ``bench/results/lerobot_pi0fast/<date>.md`` (and ``.json``).

Not part of CI: LeRobot's install is several GB (README.md beside this file).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RESULTS = REPO / 'bench' / 'results' / 'lerobot_pi0fast'
MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')
INSTRUCTIONS = ('Pick up the red cup', 'open the drawer', 'put_the block on the plate',
                'Move the arm LEFT slowly', 'close the door', 'lift the blue bowl')


def git_head() -> str:
    try:
        head = subprocess.run(['git', '-C', str(REPO), 'rev-parse', '--short', 'HEAD'],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(['git', '-C', str(REPO), 'status', '--porcelain', '--',
                                'vla_spec_ros'], capture_output=True, text=True).stdout.strip()
        return head + (' (vla_spec_ros/ has uncommitted changes)' if dirty else '')
    except (OSError, subprocess.CalledProcessError):
        return '?'


def make_checkpoint(out: Path, seed: int) -> list[str]:
    exe = shutil.which('vla-spec')
    cmd = ([exe] if exe else [sys.executable, '-m', 'vla_spec_ros.cli']) + [
        'make-checkpoint', '--preset', 'pi0fast-tiny', '--out', str(out), '--seed', str(seed)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return cmd


def checkpoint_shape(folder: Path) -> dict:
    raw = json.loads((folder / 'config.json').read_text())
    visual = [k for k, v in raw['input_features'].items() if v.get('type') == 'VISUAL']
    size = int(raw['input_features'][visual[0]]['shape'][-1])
    state = raw['input_features'].get('observation.state', {}).get('shape', [8])[-1]
    return {'slots': len(visual), 'image_size': size, 'state_dim': int(state),
            'max_action_tokens': int(raw.get('max_action_tokens', 256))}


def state_statistics(folder: Path, shape: dict):
    """(mean, std) of the checkpoint's state statistics, or None."""
    try:
        from vla_spec_ros.models.pi0fast.statistics import read_statistics
        raw = json.loads((folder / 'config.json').read_text())
        action_dim = int(raw['output_features']['action']['shape'][-1])
        stats = read_statistics(folder, raw, shape['state_dim'], action_dim)
    except Exception:  # noqa: BLE001  (no statistics: a normalised state)
        return None
    if stats is None or not {'mean', 'std'} <= set(stats.state):
        return None
    return stats.state['mean'].astype(np.float64), stats.state['std'].astype(np.float64)


def make_frames(n: int, shape: dict, seed: int, image_size: int | None, stats=None):
    rng = np.random.default_rng(seed)
    size = image_size or shape['image_size']
    slots = shape['slots']
    images = np.zeros((n, slots, size, size, 3), dtype=np.uint8)
    counts = np.zeros(n, dtype=np.int64)
    states = np.zeros((n, shape['state_dim']))
    instructions = []
    for i in range(n):
        if i % 4 == 3:                       # the previous frame again
            images[i], counts[i], states[i] = images[i - 1], counts[i - 1], states[i - 1]
            instructions.append(instructions[-1])
            continue
        counts[i] = 1 + (i % slots)
        images[i, :counts[i]] = rng.integers(0, 256, (counts[i], size, size, 3),
                                             dtype=np.uint8)
        states[i] = rng.uniform(-1, 1, shape['state_dim'])
        if stats is not None:
            states[i] = stats[0] + stats[1] * 1.2 * states[i]
        instructions.append(INSTRUCTIONS[i % len(INSTRUCTIONS)])
    return images, counts, states, instructions


def engine_frames(images, counts, states, instructions):
    from vla_spec_ros.engine.result import Frame
    out = []
    for i in range(len(counts)):
        imgs = tuple(images[i, s] for s in range(int(counts[i])))
        out.append(Frame(imgs if len(imgs) > 1 else imgs[0], instructions[i], None,
                         'robot', state=states[i]))
    return out


def cut_at(ids, end_id):
    ids = list(ids)
    return ids[:ids.index(end_id) + 1] if end_id in ids else ids


def first_difference(a, b) -> int | None:
    for k, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return k
    return None if len(a) == len(b) else min(len(a), len(b))


def project_tokens(folder: Path, frames, mode: str, dtype: str
                   ) -> tuple[list, float, dict, list]:
    from vla_spec_ros.policy import VLAPolicy
    policy = VLAPolicy.from_pretrained(str(folder), mode=mode, dtype=dtype,
                                       relax_threshold=0)
    engine = policy.engine
    unnorm = policy.unnorm_keys[0]
    t0 = time.perf_counter()
    ids = [engine.submit(f.__class__(f.image, f.instruction, unnorm, f.stream_id,
                                     state=f.state)) for f in frames]
    results = {r.request_id: r for r in engine.run_until_idle()}
    elapsed = time.perf_counter() - t0
    out, errors, actions = [], {}, []
    for k, rid in enumerate(ids):
        r = results[rid]
        if r.error is not None or r.result is None:
            errors[k] = r.error
            out.append(None)
            actions.append(None)
        else:
            out.append(list(r.result.tokens))
            actions.append(np.asarray(r.result.action, dtype=np.float64)
                           if r.result.is_valid else None)
    return out, elapsed, errors, actions


def run_lerobot(python: str, folder: Path, frames_file: Path, out: Path, work: Path,
                log: Path) -> list[str]:
    cmd = [python, str(HERE / 'lerobot_side.py'), '--checkpoint', str(folder), '--frames',
           str(frames_file), '--out', str(out), '--work', str(work)]
    env = dict(os.environ, HF_HUB_OFFLINE='1', TRANSFORMERS_OFFLINE='1')
    env.pop('PYTHONPATH', None)
    work.mkdir(parents=True, exist_ok=True)
    with open(log, 'w') as fh:
        proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=work)
    if proc.returncode != 0:
        raise SystemExit(f'LeRobot side failed ({proc.returncode}); see {log}:\n'
                         + ''.join(open(log).readlines()[-25:]))
    return cmd


def lerobot_python_default() -> str:
    return str(Path.home() / '.venvs' / 'lerobot' / 'bin' / 'python')


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument('--checkpoint', help='pi0-FAST folder; default: make pi0fast-tiny')
    p.add_argument('--seed', type=int, default=0, help='checkpoint and frame seed')
    p.add_argument('--frames', type=int, default=24)
    p.add_argument('--image-size', type=int, default=0,
                   help='camera images of this size (default: the model\'s; another size '
                        'exercises both resize-with-pad implementations)')
    p.add_argument('--modes', default=','.join(MODES))
    p.add_argument('--dtype', default='float32', help='this package\'s dtype (LeRobot runs '
                   'float32: its SigLIP path casts to float32)')
    p.add_argument('--lerobot-python', default=lerobot_python_default())
    p.add_argument('--work', help='scratch folder (default: a temp folder)')
    p.add_argument('--results', default=str(RESULTS), help='folder for <date>.md / .json')
    p.add_argument('--no-record', action='store_true', help='print only')
    args = p.parse_args(argv)

    started = dt.datetime.now(dt.timezone.utc)
    work = Path(args.work or tempfile.mkdtemp(prefix='pi0fast_cmp_')).resolve()
    work.mkdir(parents=True, exist_ok=True)
    commands = [' '.join(shlex.quote(a) for a in [sys.executable] + sys.argv)]
    if args.checkpoint:
        folder = Path(args.checkpoint).resolve()
    else:
        folder = work / 'checkpoint'
        if folder.exists():
            shutil.rmtree(folder)
        commands.append(' '.join(make_checkpoint(folder, args.seed)))
    shape = checkpoint_shape(folder)
    images, counts, states, instructions = make_frames(args.frames, shape, args.seed,
                                                       args.image_size,
                                                       state_statistics(folder, shape))
    frames = engine_frames(images, counts, states, instructions)

    project_error = None
    prompt_ids = None
    try:
        from vla_spec_ros.policy import VLAPolicy
        probe = VLAPolicy.from_pretrained(str(folder), mode='ar', dtype=args.dtype)
        runner = probe.engine.runner
        prompt_ids = [runner.frame_prompt_ids(f) for f in frames]
        codec = runner.codec
        end_token = codec.end_token
        end_of_action = codec.suffix_tokens[0] if codec.suffix_tokens else end_token
        style = getattr(runner.model, 'style', None)
    except Exception as exc:  # noqa: BLE001  (the family may not have landed yet)
        project_error = f'{type(exc).__name__}: {exc}'
        end_of_action = end_token = style = None

    arrays = {'images': images, 'num_images': counts, 'states': states,
              'instructions': np.array(instructions)}
    if prompt_ids is not None:
        arrays['project_prompt_ids'] = np.array([t for ids in prompt_ids for t in ids],
                                                dtype=np.int64)
        arrays['project_prompt_offsets'] = np.cumsum([0] + [len(x) for x in prompt_ids])
    frames_file = work / 'frames.npz'
    np.savez(frames_file, **arrays)

    lr_json, lr_log = work / 'lerobot.json', work / 'lerobot.log'
    commands.append(' '.join(shlex.quote(a) for a in run_lerobot(
        args.lerobot_python, folder, frames_file, lr_json, work / 'lerobot_work', lr_log)))
    lr = json.loads(lr_json.read_text())
    bar = lr['text_tokenizer']['bar_id']
    if end_of_action is not None and end_of_action != bar:
        print(f'note: this package\'s "|" id {end_of_action} != LeRobot\'s {bar}')
    lr_frames = lr['frames']

    rows, per_frame, action_rows = [], {}, []
    kv_vs_nokv = sum(f['tokens_kv'] == f['tokens_no_kv'] for f in lr_frames)
    if prompt_ids is not None:
        same_prompt = [list(ids) == f['lerobot_prompt_ids'] for ids, f in
                       zip(prompt_ids, lr_frames)]
    else:
        same_prompt = None
    if project_error is None:
        for mode in [m for m in args.modes.split(',') if m]:
            tokens, seconds, errors, actions = project_tokens(folder, frames, mode, args.dtype)
            both = [(a, np.asarray(f['actions'])) for a, f in zip(actions, lr_frames)
                    if a is not None and f.get('actions') is not None]
            action_rows.append({'mode': mode, 'frames_both_decoded': len(both),
                                'max_abs_difference': max(
                                    (float(np.abs(a - b).max()) for a, b in both
                                     if a.shape == b.shape), default=None),
                                'shape_mismatch': sum(a.shape != b.shape for a, b in both)})
            for ref_name, ref_key in (('LeRobot (its prompt)', 'tokens_kv'),
                                      ('LeRobot loop, this package\'s prompt',
                                       'tokens_project_prompt')):
                same, until_end, firsts = 0, 0, []
                for k, f in enumerate(lr_frames):
                    ours = cut_at(tokens[k] or [], bar)
                    theirs = f[ref_key]
                    d = first_difference(ours, theirs)
                    # This package's frame ends at EOS; LeRobot's loop stops at "|" only and
                    # goes on past EOS: equal up to and including our EOS is the same frame.
                    stopped = (d is not None and d == len(ours) and ours
                               and ours[-1] == end_token and theirs[:d] == ours)
                    same += d is None
                    until_end += bool(stopped)
                    if d is not None and not stopped:
                        firsts.append(d)
                    per_frame.setdefault(mode, {}).setdefault(ref_key, []).append(
                        {'ours': ours, 'theirs': theirs, 'first_diff': d,
                         'same_until_our_eos': bool(stopped)})
                rows.append({'mode': mode, 'reference': ref_name, 'frames': len(lr_frames),
                             'identical': same, 'same_until_our_eos': until_end,
                             'first_diff': firsts,
                             'seconds': round(seconds, 2), 'errors': errors})

    # ---- report --------------------------------------------------------------------------
    lines = []
    lines.append(f'frames: {len(lr_frames)} (images per frame: '
                 f'{sorted(set(int(c) for c in counts))}, size {images.shape[2]} px); '
                 f'LeRobot KV-cache vs full-recompute loop identical: '
                 f'{kv_vs_nokv}/{len(lr_frames)}')
    if same_prompt is not None:
        lines.append(f'prompt ids identical (this package vs LeRobot\'s preprocessor + BOS): '
                     f'{sum(same_prompt)}/{len(same_prompt)}')
    if project_error:
        lines.append(f'this package could not load the checkpoint: {project_error}')
    else:
        lines.append(f'this package\'s style: {style}; frame end marker {end_token}')
    for r in action_rows:
        lines.append(f'{r["mode"]}: un-normalised actions of the {r["frames_both_decoded"]} '
                     f'frames both sides decoded: largest |difference| '
                     f'{r["max_abs_difference"]}' + (f', {r["shape_mismatch"]} of another '
                                                     'shape' if r['shape_mismatch'] else ''))
    header = ('| mode | reference | frames | identical | identical up to our EOS (LeRobot '
              'goes on) | first differing position (other frames) |')
    table = [header, '|---|---|---|---|---|---|']
    for r in rows:
        diffs = ', '.join(str(d) for d in r['first_diff']) or '-'
        table.append(f'| {r["mode"]} | {r["reference"]} | {r["frames"]} | {r["identical"]} | '
                     f'{r["same_until_our_eos"]} | {diffs} |')
    print('\n'.join(lines))
    print('\n'.join(table))
    if args.no_record:
        return 0

    stamp = started.strftime('%Y%m%d-%H%M%S')
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    import torch
    ours_versions = {'python': sys.version.split()[0], 'torch': torch.__version__,
                     'numpy': np.__version__, 'vla_spec_ros': git_head()}
    try:
        import transformers
        ours_versions['transformers'] = transformers.__version__
    except ImportError:
        pass
    record = {'started_utc': started.isoformat(), 'commands': commands,
              'machine': {'platform': platform.platform(), 'cpus': os.cpu_count(),
                          'processor': platform.processor() or platform.machine()},
              'project': ours_versions, 'project_error': project_error,
              'checkpoint': str(folder), 'shape': shape, 'style': style, 'rows': rows,
              'actions': action_rows,
              'prompt_identical': same_prompt, 'lerobot': {k: v for k, v in lr.items()
                                                           if k != 'frames'},
              'frames': [{'num_images': int(counts[i]), 'instruction': instructions[i],
                          'state': states[i].round(4).tolist(),
                          'project_prompt_ids': prompt_ids[i] if prompt_ids else None,
                          **lr_frames[i]} for i in range(len(lr_frames))],
              'per_frame': per_frame}
    (results / f'{stamp}.json').write_text(json.dumps(record, indent=1))
    md = [f'# π0-FAST tokens: this package vs LeRobot 0.6.1 pi0_fast ({stamp} UTC)', '',
          '## Commands', '', '```'] + commands + ['```', '']
    md += ['## Versions and machine', '',
           f'- this package: {json.dumps(ours_versions)}',
           f'- LeRobot side: {json.dumps(lr["versions"])}',
           f'- machine: {json.dumps(record["machine"])}',
           f'- checkpoint: {shape}; LeRobot dimensions: {lr["dims"]}', '',
           '## Result', ''] + lines + [''] + table + ['']
    fr = lr_frames[0]
    md += ['## LeRobot facts seen in this run', '',
           f'- LeRobot\'s prompt of frame 0: `{fr["lerobot_prompt_text"]!r}` then BOS '
           f'(ids {fr["lerobot_prompt_ids"]})']
    if prompt_ids:
        md.append(f'- this package\'s prompt ids of frame 0: {prompt_ids[0]}')
    md += [f'- the project\'s config.json given to LeRobot\'s PreTrainedConfig: '
           f'{lr["project_config_json_in_lerobot"]}',
           f'- files added to LeRobot\'s copy of the folder (nothing else changed): '
           f'{json.dumps(lr["files_added_for_the_fast_processor"])}',
           f'- PI0FastPolicy.from_pretrained (strict) printed: {json.dumps(lr["load_printed"])}',
           f'- weights as LeRobot loaded them: {json.dumps(lr["weights"])}',
           f'- normalisation modes of LeRobot\'s processors: '
           f'{json.dumps(lr["normalization"])}',
           f'- LeRobot save_pretrained keys: {json.dumps(lr["lerobot_save_pretrained"])}',
           f'- text tokenizer as LeRobot reads it: {json.dumps(lr["text_tokenizer"])}',
           f'- LeRobot checkpoint files: {lr["lerobot_checkpoint_files"]}',
           f'- smallest top-2 logit margin over LeRobot\'s greedy steps: '
           f'{min(min(f["top2_margins"]) for f in lr_frames):.6f}', '',
           'Columns: "LeRobot (its prompt)" is LeRobot end to end (preprocessor, prompt, '
           'predict_action_chunk); "LeRobot loop, this package\'s prompt" is LeRobot\'s model '
           'and decoding loop fed this package\'s prompt ids (model arithmetic alone). Both '
           'sides are cut after the first "|". States are raw; both sides normalise them with '
           'the checkpoint\'s statistics.', '',
           f'Full record: `{stamp}.json` beside this file.', '']
    (results / f'{stamp}.md').write_text('\n'.join(md))
    print(f'wrote {results / (stamp + ".md")}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
