"""π0-FAST at its published shape (preset ``pi0fast-3b``: PaliGemma-3B, three cameras), random
weights built on the device: ms per chunk of transformers' PaliGemma ``generate`` (eager), the
engine's AR and the default configuration (mode ``pipeline_spec`` at the family's default
draft) and ``spec``, one robot, noise frames (one camera image each, the other slots
masked as for a robot without them).

Random weights never emit the end marker ``|``, so every chunk runs to ``--tokens`` action
tokens on every path (a LIBERO-trained π0-FAST ends its chunks after 25-35); the codec then
refuses the tokens as a chunk, which the engine reports per frame and which costs the same on
every path. The drafts' acceptance on a random model says nothing about a trained one: the
numbers that carry over are ms per verifier forward and the AR rows; the spec rows are printed
with their acceptance beside them.

The oracle rows (``--no-oracle`` for none) project the default to a trained model's
acceptance: the weights are then made decisive (gpu_setup.make_decisive_: greedy decoding
walks a fixed cycle that never writes the end marker, with wide margins, so bf16 ties cannot
flip a path off it), AR runs again on them, and spec / pipeline_spec draft AR's tokens as an
oracle chain wrong at each position with probability ``--oracle-error-rate``. The engine's
own rules apply as to any drafter (the FAST codec's bound on the chain after a miss), so the
default rate, 0.25, was chosen on pi0fast-tiny with 32-token chunks to give about 3.1 tokens
per verifier forward over 30 frames (2.7 over 6: a few frames vary): the embedded FAST model's
through the node (11.0 forwards per action for AR, 3.53 for the default: docs/demo.md); a
LIBERO-trained π0-FAST's is not known. The table gives each row's own.
Each oracle row reports its agreement with the decisive AR tokens.

    python3 bench/gpu_pi0fast.py --out DIR              # CUDA, bf16, the 3B shape
    python3 bench/gpu_pi0fast.py --smoke --out DIR      # CPU, float32, pi0fast-tiny: the script
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_setup import agreement_with, make_decisive_, share_text, tokens_again  # noqa: E402
from vla_spec_ros.baseline import make_baseline  # noqa: E402
from vla_spec_ros.bench import bench_engine, bench_hf, environment, make_frames  # noqa: E402
from vla_spec_ros.config import EngineConfig  # noqa: E402
from vla_spec_ros.engine.device.runner import TORCH_DTYPES, ModelRunner  # noqa: E402
from vla_spec_ros.engine.engine import Engine  # noqa: E402
from vla_spec_ros.models.pi0fast.family import random_in_memory  # noqa: E402
from vla_spec_ros.models.registry import preset  # noqa: E402
from vla_spec_ros.testing import OracleDrafter  # noqa: E402


def measure(args) -> list[dict]:
    cfg = dataclasses.replace(preset(args.preset), max_action_tokens=args.tokens)
    dtype = TORCH_DTYPES[args.dtype]
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as workdir:
        model, prompt, norm_stats = random_in_memory(cfg, dtype, args.device, workdir)
    print(f'built {args.preset} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B '
          f'parameters) in {time.perf_counter() - start:.1f} s', flush=True)
    base = dict(device=args.device, dtype=args.dtype, restrict_to_action_tokens=False,
                use_cuda_graphs=args.device == 'cuda')
    runner = ModelRunner(model, cfg, prompt, EngineConfig(**base), codec=model.action_codec())
    key = sorted(norm_stats)[0]
    frames = make_frames(args.warmup + args.frames, runner.image_size, args.seed, key)
    rows = []

    def record(row, label, **extra):
        out = asdict(row)
        out.update(label=label, ms_per_chunk=1e3 / row.actions_per_s, **extra)
        rows.append(out)
        print(f'{label}: {out["ms_per_chunk"]:.1f} ms per chunk, p50 {row.latency_p50_ms:.1f} '
              f'ms, tokens per verifier forward {row.acceptance_length:.2f}', flush=True)
    if not args.no_hf:
        record(bench_hf(make_baseline(runner, EngineConfig(**base)), frames, args.warmup),
               'hf eager')
        if not args.no_compiled:
            # The static-cache + torch.compile baseline (its compilation falls in the warm-up
            # frames); the smoke run goes through torch.compile's cheap "eager" backend.
            from vla_spec_ros.models.pi0fast.baseline import PaliGemmaBaseline
            compiled = PaliGemmaBaseline(runner, EngineConfig(**base), variant='compiled',
                                         compile_backend='eager' if args.smoke else 'inductor')
            record(bench_hf(compiled, frames, args.warmup), 'hf compiled')
            compiled = None
    for mode in ('ar', 'spec', 'pipeline_spec'):
        try:
            engine = Engine(runner, norm_stats, EngineConfig(mode=mode, **base))
            record(bench_engine(engine, frames, args.warmup),
                   mode + (f' ({engine.config.draft_path or cfg.default_draft})'
                           if 'spec' in mode else ''))
        except Exception as exc:     # noqa: BLE001 - one failing mode keeps the others' rows
            print(f'{mode}: FAILED {type(exc).__name__}: {exc}', flush=True)
        engine = None
    if not args.no_oracle:
        runner = None                # its graphs and ring go before the second runner's
        try:
            oracle_rows(args, model, cfg, prompt, norm_stats, base, record)
        except Exception as exc:     # noqa: BLE001 - the plain rows above are kept
            print(f'oracle rows: FAILED {type(exc).__name__}: {exc}', flush=True)
    return rows


def walk_avoids(codec) -> list[int]:
    """The ids a decisive model's walk must not write: the codec's end token and suffix (they
    end the chunk) and the tokenizer's specials (pad, eos, bos)."""
    return sorted({codec.end_token, *codec.suffix_tokens, 0, 1, 2})


def oracle_rows(args, model, cfg, prompt, norm_stats, base, record) -> None:
    """AR on decisive weights, then spec and pipeline_spec drafting its tokens as an oracle
    chain wrong at ``--oracle-error-rate`` per position (module docstring), over
    ``--oracle-frames`` frames (a few frames' tokens per forward vary)."""
    make_decisive_(model.language_model, walk_avoids(model.action_codec()))
    runner = ModelRunner(model, cfg, prompt, EngineConfig(**base), codec=model.action_codec())
    frames = make_frames(args.warmup + args.oracle_frames, runner.image_size, args.seed,
                         sorted(norm_stats)[0])
    ar = Engine(runner, norm_stats, EngineConfig(mode='ar', **base))
    record(bench_engine(ar, frames, args.warmup), 'ar decisive')
    ar_tokens = tokens_again(ar, frames)
    ar = None
    options = dict(base, tree_depth=args.chain, tree_top_k=1, tree_max_nodes=args.chain + 1)
    for mode in ('spec', 'pipeline_spec'):
        label = f'{mode} oracle ({args.oracle_error_rate:g} wrong per position)'
        try:
            draft = OracleDrafter(lambda rid: ar_tokens[rid % len(frames)],
                                  runner.max_action_tokens, args.oracle_error_rate,
                                  seed=args.seed)
            engine = Engine(runner, norm_stats, EngineConfig(mode=mode, **options), draft=draft)
            row = bench_engine(engine, frames, args.warmup)
            record(row, label, **agreement_with(tokens_again(engine, frames), ar_tokens))
        except Exception as exc:     # noqa: BLE001 - one failing mode keeps the others' rows
            print(f'{label}: FAILED {type(exc).__name__}: {exc}', flush=True)
        engine = None


def format_rows(rows: list[dict]) -> str:
    hf = next((r for r in rows if r['label'] == 'hf eager'), None)
    compiled = next((r for r in rows if r['label'] == 'hf compiled'), None)
    lines = ['| path | ms / chunk | vs HF eager | vs HF compiled | p50 ms | tokens / chunk | '
             'tokens / verifier forward | frames = decisive AR |',
             '|---|---|---|---|---|---|---|---|']
    for r in rows:
        ratio = f'{r["ms_per_chunk"] / hf["ms_per_chunk"]:.3f}' if hf else '–'
        ratio_c = f'{r["ms_per_chunk"] / compiled["ms_per_chunk"]:.3f}' if compiled else '–'
        lines.append(f'| {r["label"]} | {r["ms_per_chunk"]:.1f} | {ratio} | {ratio_c} | '
                     f'{r["latency_p50_ms"]:.1f} | {r["tokens_per_action"]:.1f} | '
                     f'{r["acceptance_length"]:.2f} | '
                     f'{share_text(r.get("frames_equal_reference"))} |')
    return '\n'.join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--preset', default='pi0fast-3b')
    p.add_argument('--device', default='cuda')
    p.add_argument('--dtype', default='bfloat16')
    p.add_argument('--tokens', type=int, default=32,
                   help='action tokens per chunk (max_action_tokens; random weights reach it)')
    p.add_argument('--frames', type=int, default=6)
    p.add_argument('--warmup', type=int, default=2)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--no-hf', action='store_true')
    p.add_argument('--no-compiled', action='store_true',
                   help='without the static-cache + torch.compile baseline row')
    p.add_argument('--oracle-error-rate', type=float, default=0.25,
                   help='the oracle rows\' chance of a wrong draft at each position')
    p.add_argument('--no-oracle', action='store_true', help='without the oracle rows')
    p.add_argument('--oracle-frames', type=int, default=24,
                   help='timed frames of the oracle rows')
    p.add_argument('--chain', type=int, default=8, help='the oracle\'s draft chain length')
    p.add_argument('--smoke', action='store_true',
                   help='CPU, float32, pi0fast-tiny: checks the script, timings meaningless')
    p.add_argument('--out', type=Path, default=ROOT / 'bench' / 'results' / 'gpu')
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.device, args.dtype, args.frames, args.warmup = (
            'pi0fast-tiny', 'cpu', 'float32', 2, 1)
        args.oracle_frames = min(args.oracle_frames, 8)
    elif not torch.cuda.is_available():
        print('gpu_pi0fast: CUDA is required (use --smoke to check the script on CPU)')
        return 0
    rows = measure(args)
    table = format_rows(rows)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime('%Y%m%d-%H%M%S')
    command = 'python3 bench/gpu_pi0fast.py ' + ' '.join(argv if argv is not None
                                                         else sys.argv[1:])
    (args.out / f'pi0fast-{args.preset}-{args.device}-{stamp}.json').write_text(json.dumps(
        {'command': command, 'environment': environment(), 'tokens': args.tokens,
         'rows': rows}, indent=2))
    (args.out / f'pi0fast-{args.preset}-{args.device}-{stamp}.md').write_text(
        f'command: `{command}`\n\n{json.dumps(environment())}\n\n{table}\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
