"""A reasoning VLA's control step at its published shape (preset ``ecot-openvla-7b-bridge``:
OpenVLA-7B with ECoT's prompt and codec), random weights built on the device: ms per step of
the transformers baseline (``generate`` with the same budget), the engine's AR, and the spec
modes drafting the AR tokens at the embedded reasoning model's measured acceptance.

The random weights are made decisive (gpu_setup.make_decisive_): greedy decoding walks a
fixed cycle of ids that never opens the action or stops the text, with wide logit margins, so
every step runs to its text budget (``--reasoning-tokens``, 200 by default) and is then refused
for want of an action, at the same cost on every path. Plain random weights
(``--flat-logits``) have near-flat logits: a bf16 tie flips between the eager reference's
kernels and the engine's (graphs, segment attention, chain-shaped verifier products), and a
row that leaves the oracle's trajectory gets no draft right after it (the 2026-11-30 H200
run: 3.5 tokens per forward where 12.2 were meant). On the CPU every path must decode the
eager AR reference's tokens exactly (a row that does not fails); on a device each row reports
its agreement with the reference (frames equal, mean shared prefix). A random model's own
outputs say nothing about a trained one's drafts, so the spec rows draft with an oracle chain
(testing.OracleDrafter): the engine's own AR tokens with a per-position error rate chosen so
that a verifier forward gains ``--tokens-per-forward`` tokens on average (12.2 by default:
metaworld-demo-reason's default mode, 66 tokens per step in 5.4 forwards, docs/reasoning.md),
in chains of up to ``--chain`` tokens per forward.

    python3 bench/gpu_reasoning.py --out DIR              # CUDA, bf16, the 7B shape
    python3 bench/gpu_reasoning.py --smoke --out DIR      # CPU, float32, ecot-tiny: the script
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from gpu_setup import (agreement_with, chain_error_rate, make_decisive_,  # noqa: E402
                       random_on_device, share_text, tokens_again)
from records import write_record  # noqa: E402
from vla_spec_ros.bench import bench_engine, bench_hf, environment, make_frames  # noqa: E402
from vla_spec_ros.config import EngineConfig  # noqa: E402
from vla_spec_ros.engine.ar import reference_tokens  # noqa: E402
from vla_spec_ros.engine.device.runner import ModelRunner  # noqa: E402
from vla_spec_ros.engine.engine import Engine  # noqa: E402
from vla_spec_ros.models.ecot.baseline import make_baseline  # noqa: E402
from vla_spec_ros.models.ecot.checkpoint import SAMPLE_REASONINGS  # noqa: E402
from vla_spec_ros.models.ecot.model import EcotVLA  # noqa: E402
from vla_spec_ros.models.ecot.prompt import EcotPrompt  # noqa: E402
from vla_spec_ros.models.openvla.prompt import PromptTokenizer, build_tokenizer  # noqa: E402
from vla_spec_ros.models.openvla.random_checkpoint import synthetic_norm_stats  # noqa: E402
from vla_spec_ros.models.registry import preset  # noqa: E402
from vla_spec_ros.testing import OracleDrafter  # noqa: E402

TOKENIZER_VOCAB = 1024      # a small real tokenizer; the 7B vocabulary only sizes the tables


def ending_ids(codec, cfg) -> list[int]:
    """The ids a decisive model's walk must not write (they would end the text or open the
    action): the codec's marker, separator and stop tokens, its action tokens, the padding
    rows and the tokenizer's specials (unk, bos, eos)."""
    vocab = cfg.llm.vocab_size
    ids = {*codec.marker, *codec.separator, *codec.stop_tokens, 0, 1, 2,
           *range(cfg.pad_token_id, vocab)}
    return sorted(ids | {t for t in range(vocab) if codec.is_action_token(t)})


def build(name: str, device: str, dtype: str, budget: int, seed: int, decisive: bool = True):
    """Preset ``name`` with random weights materialised on the device in ``dtype`` (made
    decisive unless ``decisive`` is False: gpu_setup.make_decisive_), a small tokenizer that
    knows ECoT's tags, synthetic statistics -> (model, cfg, prompt, stats)."""
    cfg = dataclasses.replace(preset(name), max_reasoning_tokens=budget)
    model = random_on_device(EcotVLA, cfg, device, dtype, seed)
    tokenizer = build_tokenizer(min(cfg.pad_token_id, TOKENIZER_VOCAB), seed,
                                extra_text=list(SAMPLE_REASONINGS) * 50)
    prompt = EcotPrompt(PromptTokenizer(tokenizer))
    model.use_prompt(prompt)
    if decisive:
        make_decisive_(model.language_model, ending_ids(model.action_codec(), cfg))
    return model, cfg, prompt, synthetic_norm_stats(cfg.action_dim, seed)


def measure(args) -> dict:
    start = time.perf_counter()
    model, cfg, prompt, norm_stats = build(args.preset, args.device, args.dtype,
                                           args.reasoning_tokens, args.seed,
                                           decisive=not args.flat_logits)
    print(f'built {args.preset} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B '
          f'parameters) in {time.perf_counter() - start:.1f} s', flush=True)
    base = dict(device=args.device, dtype=args.dtype, max_reasoning_tokens=args.reasoning_tokens,
                use_cuda_graphs=args.device == 'cuda' and not args.no_graphs)
    runner = ModelRunner(model, cfg, prompt, EngineConfig(**base), codec=model.action_codec())
    key = sorted(norm_stats)[0]
    frames = make_frames(args.warmup + args.frames, runner.image_size, args.seed, key)
    reference = reference_tokens(runner, frames, EngineConfig(**{**base,
                                                                 'use_cuda_graphs': False}))
    rate = chain_error_rate(args.tokens_per_forward, args.chain)
    exact = not args.device.startswith('cuda')
    rows, failures = [], []
    ar_tokens: list = []        # the engine AR row's tokens: the oracle's chains

    def record(label, make_row):
        """``make_row()`` -> (BenchRow, the row's agreement fields)."""
        try:
            row, agreement = make_row()
        except Exception as exc:     # noqa: BLE001 - one failing row keeps the others
            failures.append(f'{label}: {type(exc).__name__}: {exc}')
            print(failures[-1], flush=True)
            return
        out = asdict(row)
        out.update(label=label, ms_per_step=1e3 / row.actions_per_s, **agreement)
        rows.append(out)
        print(f'{label}: {out["ms_per_step"]:.1f} ms per step, p50 {row.latency_p50_ms:.1f} ms, '
              f'{row.forwards_per_action:.1f} verifier forwards per step, '
              f'{row.tokens_per_action:.0f} tokens per step', flush=True)

    def engine_row(mode):
        draft = None
        options = dict(base)
        if mode in ('spec', 'pipeline_spec'):
            # Request ids count the frames through every pass of this engine, in order.
            chains = ar_tokens if ar_tokens else reference
            draft = OracleDrafter(lambda rid: chains[rid % len(frames)],
                                  runner.max_action_tokens, rate, seed=args.seed)
            options.update(tree_depth=args.chain, tree_top_k=1, tree_max_nodes=args.chain + 1)
        engine = Engine(runner, norm_stats, EngineConfig(mode=mode, **options), draft=draft)
        row = bench_engine(engine, frames, args.warmup)
        tokens = tokens_again(engine, frames)
        if exact and tokens != reference:
            raise AssertionError(f'{mode}: tokens differ from the eager AR reference')
        agreement = agreement_with(tokens, reference)
        if mode == 'ar':
            ar_tokens[:] = tokens
        else:        # against the chains the oracle drafted: the trajectory its rate assumes
            drafted = agreement_with(tokens, chains)
            agreement.update(oracle_source='ar row' if chains is ar_tokens else 'eager reference',
                             frames_equal_drafted=drafted['frames_equal_reference'],
                             drafted_prefix=drafted['shared_prefix'])
        return row, agreement

    if not args.no_hf:
        record('hf generate (eager, same budget)',
               lambda: (bench_hf(make_baseline(runner, EngineConfig(**base)), frames,
                                 args.warmup), {}))
    for mode in ('ar', 'spec', 'pipeline_spec'):
        label = mode if mode == 'ar' else (f'{mode} (oracle chain, {args.tokens_per_forward:g} '
                                           'tokens per forward)')
        record(label, lambda mode=mode: engine_row(mode))
    return {'rows': rows, 'failures': failures, 'error_rate': rate,
            'tokens_per_step': len(reference[0]) if reference else 0}


def format_rows(result: dict) -> str:
    rows = result['rows']
    ar = next((r for r in rows if r['label'] == 'ar'), None)
    hf = next((r for r in rows if r['label'].startswith('hf')), None)
    lines = ['| row | ms per step | p50 ms | verifier forwards per step | x AR ms | x HF ms | '
             'frames = eager AR | shared prefix | shares of the drafted chains |',
             '|---|---|---|---|---|---|---|---|---|']
    for r in rows:
        x_ar = f'{r["ms_per_step"] / ar["ms_per_step"]:.3f}' if ar else '-'
        x_hf = f'{r["ms_per_step"] / hf["ms_per_step"]:.3f}' if hf else '-'
        lines.append(f'| {r["label"]} | {r["ms_per_step"]:.1f} | {r["latency_p50_ms"]:.1f} | '
                     f'{r["forwards_per_action"]:.1f} | {x_ar} | {x_hf} | '
                     f'{share_text(r.get("frames_equal_reference"))} | '
                     f'{share_text(r.get("shared_prefix"))} | '
                     f'{share_text(r.get("drafted_prefix"))} |')
    return '\n'.join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--smoke', action='store_true',
                        help='CPU, float32, ecot-tiny, 40 reasoning tokens: checks the script')
    parser.add_argument('--preset', default='ecot-openvla-7b-bridge')
    parser.add_argument('--device', default='cuda')
    parser.add_argument('--dtype', default='bfloat16')
    parser.add_argument('--reasoning-tokens', type=int, default=200)
    parser.add_argument('--tokens-per-forward', type=float, default=12.2)
    parser.add_argument('--chain', type=int, default=16, help='draft tokens per forward (<= 16)')
    parser.add_argument('--frames', type=int, default=4)
    parser.add_argument('--warmup', type=int, default=1)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--no-hf', action='store_true')
    parser.add_argument('--no-graphs', action='store_true')
    parser.add_argument('--flat-logits', action='store_true',
                        help='plain random weights (near-flat logits: bf16 ties flip the '
                             'rows off the oracle\'s trajectory) instead of decisive ones')
    parser.add_argument('--out', default=None)
    args = parser.parse_args(argv)
    if args.smoke:
        args.preset, args.device, args.dtype = 'ecot-tiny', 'cpu', 'float32'
        args.reasoning_tokens, args.frames = min(args.reasoning_tokens, 40), 2
    elif not torch.cuda.is_available() and args.device.startswith('cuda'):
        print('gpu_reasoning: CUDA is required (use --smoke to check the script on CPU)')
        return 0
    result = measure(args)
    table = format_rows(result)
    given = sys.argv[1:] if argv is None else argv
    text = '\n'.join([
        f'# A reasoning step at {args.preset}\'s shape ({time.strftime("%Y-%m-%d %H:%M:%S")})',
        '', f'command: `python3 bench/gpu_reasoning.py {" ".join(given)}`', '',
        f'{result["tokens_per_step"]} tokens per step (the {args.reasoning_tokens}-token budget '
        f'run out: random weights), oracle error rate {result["error_rate"]:.4f} per draft '
        f'token, chains of {args.chain}', '', table, '',
        *(f'- FAILED {f}' for f in result['failures'])])
    print(text)
    if args.out:
        write_record(args.out, f'reasoning-{args.preset}', text,
                     {'args': vars(args), 'environment': environment(), **result})
    return 1 if result['failures'] else 0


if __name__ == '__main__':
    sys.exit(main())
