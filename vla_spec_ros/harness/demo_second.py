"""The main job's further models (`vla-spec demo --second-model`; `auto`, the default, is the
next embedded model: the π0-FAST model `metaworld-demo-fast` after the default
`metaworld-demo`, then the reasoning model `metaworld-demo-reason` after it): after the first
model's parts, the same job's stream, speed and lockstep parts run again for the next model, as
their own record beside the first; a pass with `auto` then runs the model after it.

Each further model's success runs through the node in real time
(`--sim-mode realtime`: the node publishes a chunk's steps on its control clock, the bridge
steps the arm on its own), with the `chunk_blend` its family recommends (the registry's
node_settings: ACT's temporal ensemble for pi0-FAST, the blend that measured best for it:
docs/demo.md; a single-step model's is the node's default), and only AR and the engine's
default mode run (its own baseline and what a user gets). Everything else (tasks, episodes,
rates, seconds, seed, dtype, device, control rate, out) is the first run's. The pass is
written as the equivalent standalone `vla-spec demo` command, recorded in its record.
"""
from __future__ import annotations

import argparse

# Parts that run again for the second model; delay and relax stay the first model's.
SECOND_MODEL_PARTS = ('stream', 'speed', 'lockstep')
NO_SECOND_MODEL = ('', 'none')
# `--second-model auto`: the main job's chain of embedded models (each -> the next); after any
# other model there is no further pass (a user's own checkpoint runs alone).
AUTO_SECOND_MODEL = {'metaworld-demo': 'metaworld-demo-fast',
                     'metaworld-demo-fast': 'metaworld-demo-reason'}


def resolve_second_model(args) -> str:
    """The second model's name, or '' for none (`auto`: AUTO_SECOND_MODEL's)."""
    second = getattr(args, 'second_model', '') or ''
    if second == 'auto':
        return AUTO_SECOND_MODEL.get(args.model, '')
    return '' if second in NO_SECOND_MODEL else second


def second_model_argv(args, plan) -> list[str] | None:
    """The `vla-spec demo` arguments of the second model's pass, or None when there is none
    (`--second-model none`, the same model as `--model`, or no part of SECOND_MODEL_PARTS)."""
    from vla_spec_ros.config import EngineConfig
    from vla_spec_ros.harness.demo_options import recommended_chunk_blend
    second = resolve_second_model(args)
    parts = [p for p in plan['parts'] if p in SECOND_MODEL_PARTS]
    if not second or second == args.model or not parts:
        return None
    modes = ['ar'] + [m for m in (EngineConfig().mode,) if m != 'ar']
    argv = ['demo', '--model', second, '--parts', ','.join(parts), '--modes', ','.join(modes),
            '--sim-mode', 'realtime', '--chunk-blend', recommended_chunk_blend(second),
            '--second-model', 'auto' if second in AUTO_SECOND_MODEL else 'none',
            '--tasks', ','.join(plan['tasks']),
            '--episodes', str(plan['episodes']), '--seed', str(args.seed),
            '--max-steps', str(plan['max_steps']),
            '--control-rate-hz', f"{plan['control_rate_hz']:g}",
            '--stream-hz', f"{plan['stream_hz']:g}",
            '--stream-seconds', f"{plan['stream_seconds']:g}",
            '--rates', ','.join(f'{r:g}' for r in plan['rates']),
            '--speed-frames', str(plan['speed_frames']), '--threads', str(plan['threads']),
            '--dtype', args.dtype, '--device', args.device, '--out', str(args.out)]
    return argv + (['--verbose'] if args.verbose else [])


def second_model_args(argv: list[str]):
    """The parsed options of `second_model_argv` (with `argv` kept for the record)."""
    from vla_spec_ros.harness.demo_options import add_arguments
    parser = argparse.ArgumentParser(prog='vla-spec demo')
    add_arguments(parser)
    args = parser.parse_args(argv[1:])
    args.argv = list(argv)
    return args


__all__ = ['SECOND_MODEL_PARTS', 'NO_SECOND_MODEL', 'AUTO_SECOND_MODEL', 'resolve_second_model',
           'second_model_argv', 'second_model_args']
