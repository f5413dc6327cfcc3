"""What every part of bench/gpu.py builds on: the preset with random weights on the device, a
runner over it, the oracle draft tuned to an acceptance length (with the exact recursion that
tunes it), the model pieces' timings, and running a list of frames through an engine."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import TORCH_DTYPES, ModelRunner
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.models.openvla.checkpoint import init_random_
from vla_spec_ros.models.openvla.config import VLAConfig
from vla_spec_ros.models.openvla.prompt import PromptTokenizer, build_tokenizer
from vla_spec_ros.models.openvla.random_checkpoint import synthetic_norm_stats
from vla_spec_ros.models.openvla.vla import OpenVLA
from vla_spec_ros.models.registry import preset
from vla_spec_ros.testing import OracleDrafter

# Oracle acceptance lengths of the spec rows; 3.5 is the most seven tokens allow (the prefill
# decides one, one verify round the other six).
TARGET_ACCEPTANCE = (2.0, 3.0, 3.5)


def expected_acceptance(accept_prob: float, depth: int, action_dim: int) -> float:
    """Mean tokens per verifier round (the prefill's one token included, as the engine counts)
    when every chain draft position is right with probability ``accept_prob``: action_dim over
    the expected number of rounds, from the exact recursion over the tokens still needed."""
    rounds = [0.0] * action_dim                   # rounds[r]: expected rounds to decide r tokens
    for remaining in range(1, action_dim):
        d = min(depth, remaining - 1)
        total = 1.0
        for k in range(d + 1):                    # k drafts accepted, then the bonus token
            prob = accept_prob ** k * ((1 - accept_prob) if k < d else 1.0)
            total += prob * rounds[remaining - k - 1]
        rounds[remaining] = total
    return action_dim / (1.0 + rounds[action_dim - 1])


def solve_unit(increasing, target: float) -> float:
    """The x in [0, 1] where ``increasing(x)`` reaches ``target`` (bisection, 60 halvings):
    1 when ``increasing(1)`` is at or below it, 0 when ``increasing(0)`` is above it."""
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if increasing(mid) < target:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def acceptance_error_rate(target: float, depth: int, action_dim: int = 7) -> float:
    """Per-position error rate of the oracle draft that gives mean acceptance ``target``."""
    if target >= expected_acceptance(1.0, depth, action_dim):
        return 0.0
    return 1.0 - solve_unit(lambda p: expected_acceptance(p, depth, action_dim), target)


@dataclass
class Weights:
    """One model on the device and what a runner needs beside it."""
    model: OpenVLA
    cfg: VLAConfig
    tokenizer: PromptTokenizer
    norm_stats: dict
    source: str | None = None      # a checkpoint's folder (its draft head), None for presets


def random_on_device(model_class, cfg, device: str, dtype: str, seed: int):
    """``model_class(cfg)`` with random weights (``init_random_``), materialised directly on
    the device in the target dtype (no 30 GB float32 copy on the host), in eval mode."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(TORCH_DTYPES[dtype])
    try:
        with torch.device(device):
            torch.manual_seed(seed)
            model = model_class(cfg)
            init_random_(model)
    finally:
        torch.set_default_dtype(previous)
    return model.eval()


# How far the token embedding outweighs what the decoder layers add to the residual stream in
# a decisive model (``make_decisive_``): init_random_'s rows have norm ~1 and each layer adds
# ~sqrt(hidden) to the stream, so 1e4 keeps the token's direction past 32 layers of 4096.
DECISIVE_EMBED_SCALE = 1e4


def make_decisive_(language_model, avoid=()) -> None:
    """Give a random language model a greedy path with wide margins, for benches whose rows
    must follow one token trajectory. Greedy decoding then walks a fixed cycle through the
    ids not in ``avoid`` (ids that would end or change the output: markers, stop tokens,
    action tokens), and from an avoided id steps into that cycle: the token embedding scaled
    by ``DECISIVE_EMBED_SCALE`` so that the last token's direction dominates the final hidden
    state, and each lm_head row the sum of its predecessors' unit embeddings (one, or two
    where an avoided id steps in), a logit margin of ~sqrt(hidden / 2) over the rest. A
    random model's near-flat logits tie often and a bf16 tie flips between kernel shapes
    (eager against graphed, one row against a verified chain); these do not. The arithmetic
    of every forward is that of any dense model of the shape: no weight is zero or sparse
    but the rows of avoided ids in the lm_head."""
    embed = language_model.model.embed_tokens.weight
    head = language_model.lm_head.weight
    vocab = embed.shape[0]
    avoided = torch.zeros(vocab, dtype=torch.bool)
    avoided[[int(t) for t in avoid if 0 <= int(t) < vocab]] = True
    plain = (~avoided).nonzero().flatten()
    others = avoided.nonzero().flatten()
    if len(plain) < 2:
        raise ValueError('make_decisive_: fewer than two ids left to walk')
    # Each plain id steps to the next one (a cycle); the avoided ids step in spread over it.
    sources = torch.cat([plain, others])
    targets = torch.cat([torch.roll(plain, -1),
                         plain[torch.arange(len(others)) * len(plain) // max(len(others), 1)]])
    with torch.no_grad():
        unit = embed.float()
        unit /= unit.norm(dim=1, keepdim=True)
        rows = torch.zeros(vocab, embed.shape[1], dtype=torch.float32, device=embed.device)
        rows.index_add_(0, targets.to(embed.device), unit[sources.to(embed.device)])
        if head.data_ptr() == embed.data_ptr():         # a tied head (Gemma's) gets its own
            language_model.lm_head.weight = torch.nn.Parameter(rows.to(head.dtype),
                                                               requires_grad=False)
        else:
            head.copy_(rows.to(head.dtype))
        embed.mul_(DECISIVE_EMBED_SCALE)


def chain_tokens_per_forward(error_rate: float, chain: int) -> float:
    """Expected tokens a verifier forward gains from an oracle chain of ``chain`` drafts, each
    wrong with probability ``error_rate``: the accepted prefix plus the bonus token."""
    keep = 1.0 - error_rate
    return 1.0 + sum(keep ** k for k in range(1, chain + 1))


def chain_error_rate(tokens_per_forward: float, chain: int) -> float:
    """The error rate whose chain gains ``tokens_per_forward`` (bisection; clipped to what a
    chain of ``chain`` can give: 1 to chain + 1)."""
    target = min(max(tokens_per_forward, 1.0), chain + 1.0)
    return 1.0 - solve_unit(lambda keep: chain_tokens_per_forward(1.0 - keep, chain), target)


def tokens_again(engine, frames) -> list[tuple]:
    """Every frame once more through an idle ``engine`` (a fresh request each), in order: the
    tokens of each."""
    return [fin.result.tokens for fin in run_all(engine, frames)]


def share_text(value) -> str:
    """A share for a table cell: '-' when not recorded."""
    return '-' if value is None else f'{value:.0%}'


def agreement_with(tokens: list, reference: list) -> dict:
    """How far ``tokens`` (one tuple per frame) follow ``reference``: the share of frames
    equal to it and the mean share of each reference it reproduces before the first
    difference."""
    def shared_prefix(a, b):
        n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return n / max(len(b), 1)
    pairs = list(zip(tokens, reference))
    return {'frames_equal_reference': sum(a == b for a, b in pairs) / max(len(pairs), 1),
            'shared_prefix': sum(shared_prefix(a, b) for a, b in pairs) / max(len(pairs), 1)}


def build_model(name: str, device: str, dtype: str, seed: int) -> Weights:
    """Preset ``name`` with random weights on the device (``random_on_device``), a real small
    tokenizer (the prompt path is that of a loaded checkpoint; the 7B vocabulary only sizes
    the embedding table) and synthetic dataset statistics."""
    cfg = preset(name)
    model = random_on_device(OpenVLA, cfg, device, dtype, seed)
    tokenizer = PromptTokenizer(build_tokenizer(min(cfg.pad_token_id, 1024), seed))
    return Weights(model, cfg, tokenizer, synthetic_norm_stats(cfg.action_dim))


def load_checkpoint(source: str, device: str, dtype: str, weight_dtype: str = 'auto') -> Weights:
    """A real checkpoint (a folder, or a name such as metaworld-demo) with its own tokenizer
    and dataset statistics (``weight_dtype`` fp8: its decoder quantised at load)."""
    from vla_spec_ros.policy import VLAPolicy
    policy = VLAPolicy.from_pretrained(source, device=device, dtype=dtype,
                                       weight_dtype=weight_dtype)
    runner = policy.engine.runner
    return Weights(runner.model, runner.cfg, runner.tokenizer, policy.engine.norm_stats,
                   policy.source)


def second_copy(args, weights: Weights, weight_dtype: str) -> Weights:
    """The same weights loaded again for runners with another ``weight_dtype`` (a model object
    holds one kind of weights, models/fp8.py): the preset rebuilt from the same seed on the
    same device, or the checkpoint read again."""
    if weights.source is not None:
        return load_checkpoint(weights.source, args.device, args.dtype, weight_dtype)
    return build_model(args.preset, args.device, args.dtype, args.seed)


def engine_options(args, use_graphs: bool, **extra) -> dict:
    """The EngineConfig options every runner and engine of one setting share."""
    options = dict(device=args.device, dtype=args.dtype, use_cuda_graphs=use_graphs,
                   weight_dtype=getattr(args, 'weight_dtype', 'auto'))
    return {**options, **extra}


def graphs_setting(args, position: int) -> bool:
    """Whether ``--graphs``' setting at ``position`` (0: first, -1: last) is "on"."""
    return args.graphs.split(',')[position].strip() == 'on'


def build_runner(weights: Weights, options: dict) -> ModelRunner:
    """A runner with the device, dtype, CUDA-graph and kernel choice of ``options``."""
    return ModelRunner(weights.model, weights.cfg, weights.tokenizer, EngineConfig(**options),
                       checkpoint_folder=weights.source)


def eager_reference(runner, frames, options: dict) -> list:
    """The plain AR reference tokens of ``frames`` (eager, dense attention): what the spec
    rows' oracle drafts and every check compares with."""
    return reference_tokens(runner, frames, EngineConfig(**{**options, 'use_cuda_graphs': False}))


def engine_for(runner, weights: Weights, label: str, options: dict, ref=None, seed: int = 0):
    """An engine for a row label: a mode (``pipeline``) or a mode at an oracle acceptance
    (``pipeline_spec@3.0``, drafting ``ref``'s tokens)."""
    mode, _, target = label.partition('@')
    if target:
        return spec_engine(runner, weights.norm_stats, mode, float(target), ref, options, seed)
    return Engine(runner, weights.norm_stats, EngineConfig(mode=mode, **options))


def median_ms(fn, sync, repeats: int = 20) -> float:
    """Median milliseconds of ``fn()`` over ``repeats`` calls after 3 warm-up calls, each call
    timed on the host clock up to ``sync()`` (``torch.cuda.synchronize`` on a GPU)."""
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return float(np.median(times))


def decode_steps(ring, prompt_length: int, rows: int):
    """``rows`` one-token decode rows after a prompt of ``prompt_length`` tokens, each in its
    own 512-slot stretch of ``ring``: the step of an AR decode (rows = 1) or of eight frames
    decoding side by side."""
    from vla_spec_ros.engine.device.step_inputs import chain_rows, pack_step
    return pack_step([], [chain_rows(512 * i, 4096, prompt_length, [5]) for i in range(rows)],
                     ring.scratch_slot, num_cols=((prompt_length + 128) // 128) * 128)


def time_pieces(runner, frames, base: dict, repeats: int = 20) -> dict:
    """Median ms of the model pieces one step is built from (synchronised wall clock)."""
    from vla_spec_ros.engine.device.step_inputs import PrefillRows, pack_step
    sync = torch.cuda.synchronize if runner.device.type == 'cuda' else (lambda: None)
    ring = runner.new_ring(4096, EngineConfig(**base))
    prompt = runner.prepare_prompt(frames[0], EngineConfig(**base))
    length = prompt.embeds.shape[0]
    steps = {
        'prefill': (pack_step([PrefillRows(0, 4096, length)], [], ring.scratch_slot,
                              num_cols=128), [prompt.embeds]),
        'decode_1': (decode_steps(ring, length, 1), []),
        'decode_8x1': (decode_steps(ring, length, 8), [])}
    out = {}
    from vla_spec_ros.models.openvla.preprocess import preprocess_image
    # The engine's path (uint8 upload, preprocessing on the device) and the CPU reference
    # (preprocessing on the host, a blocking upload of the float pixels).
    out['preprocess'] = median_ms(lambda: runner.prepare_pixels(frames[0], EngineConfig(**base)),
                                  sync, repeats)
    out['preprocess_on_host'] = median_ms(lambda: preprocess_image(
        frames[0].image, runner.cfg, dtype=runner.dtype, device=runner.device), sync, repeats)
    if runner.device.type == 'cuda':
        # The vision towers as CUDA graphs: one after the other (the model's reference) and
        # side by side on two streams (what the runner uses on a GPU).
        from vla_spec_ros.engine.device.packed_forward import GraphedFunction
        pixels = preprocess_image(frames[0].image, runner.cfg, dtype=runner.dtype,
                                  device=runner.device)[None]
        for name, towers in (('vision_serial', runner.model.image_embeddings),
                             ('vision_side_by_side', runner.image_embeddings)):
            graph = GraphedFunction(lambda inputs, f=towers: {'p': f(inputs['pixels'])},
                                    runner.device)
            out[name] = median_ms(lambda g=graph: g({'pixels': pixels}), sync, repeats)
    out['vision+prompt'] = median_ms(lambda: runner.prepare_prompt(frames[0],
                                                                   EngineConfig(**base)),
                                     sync, repeats)
    for name, (step, embeds) in steps.items():
        out[name] = median_ms(lambda: ring.run(step, embeds), sync, repeats)
    return out


def spec_engine(runner, norm_stats, mode: str, target: float, ref, base: dict, seed: int):
    """An engine of ``mode`` with the oracle chain draft tuned to acceptance ``target``."""
    depth = runner.max_action_tokens - 2
    rate = acceptance_error_rate(target, depth, runner.max_action_tokens)
    draft = OracleDrafter(ref.__getitem__, runner.max_action_tokens, rate, seed=seed)
    ecfg = EngineConfig(mode=mode, tree_depth=depth, tree_top_k=1, tree_max_nodes=depth + 1,
                        **base)
    return Engine(runner, norm_stats, ecfg, draft=draft)


def run_all(engine, frames):
    for f in frames:
        engine.submit(f)
    out = engine.run_until_idle()
    return sorted(out, key=lambda fin: fin.request_id)


# Temporal drafting rows: each camera shows each frame this many times in a row (random
# weights act differently on every random frame; a repeated frame is the case where the
# previous action is right, a robot holding still), so the rows time the drafter with real
# acceptance and no draft forward.
TEMPORAL_REPEATS = 4


def repeated_frames(frames: list, streams: int, repeats: int) -> list:
    """``frames`` (frame i of stream i % streams) with each stream's frames shown ``repeats``
    times in a row, the same count and stream of each position."""
    return [frames[(i // (streams * repeats)) * streams + i % streams]
            for i in range(len(frames))]


# Episode-like rows: each camera's frames come in runs of this many control steps of one
# scene that drifts a pixel per step (consecutive frames alike but not equal, as a robot's
# camera sees an episode), then the next scene and instruction.
EPISODE_RUN = 8


def episode_like_frames(frames: list, streams: int, run: int) -> list:
    """``frames`` (frame i of stream i % streams) turned into runs of ``run`` steps per stream:
    the run's first frame with its image shifted one more pixel sideways each step; the same
    count, stream and instruction pattern as ``frames``."""
    out = []
    for i in range(len(frames)):
        step_of_stream = i // streams
        first = (step_of_stream - step_of_stream % run) * streams + i % streams
        image = np.roll(frames[first].image, step_of_stream % run, axis=1)
        out.append(dataclasses.replace(frames[first], image=image))
    return out
