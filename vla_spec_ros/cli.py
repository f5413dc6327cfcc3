"""The ``vla-spec`` command: make-checkpoint, predict, bench, fidelity, train-draft (and the
simulator commands once their dependencies are installed)."""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np

from .config import MODES, EngineConfig
from .validation import at_least, positive_float
from .models.registry import PRESETS


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument('--device', default='cpu', help='cpu or cuda[:N]')
    p.add_argument('--dtype', default='float32',
                   choices=['float32', 'float64', 'bfloat16', 'float16'])
    p.add_argument('--draft-path', default=None,
                   help='drafter of the speculative modes: empty = the model\'s default draft; '
                   '"previous_action", "shifted_chunk", an EAGLE draft head folder, '
                   '"checkpoint" or "random"')


# What describes a checkpoint's weights beside the files make-checkpoint writes: the weights of
# another layout (a shard index is read before model.safetensors), a trained model's report,
# the demonstrations it learnt from, the node settings measured on it and its draft head.
# --force removes them, so nothing left in the folder describes weights that are gone.
REPLACED_BY_MAKE_CHECKPOINT = ('model.safetensors.index.json', 'training.json',
                               'demos_manifest.json', 'vla_spec_node.json', 'draft')


def _prepare_checkpoint_out(out: Path, force: bool) -> None:
    """A random checkpoint goes into a new or empty --out (a file there is the family
    writer's FileExistsError). A folder holding anything is refused unless ``force``, which
    removes the old weights and what describes them (REPLACED_BY_MAKE_CHECKPOINT)."""
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if not held:
        return
    if not force:
        shown = ', '.join(held[:4]) + (', ...' if len(held) > 4 else '')
        raise ValueError(f'--out: {out} is not empty ({shown}); make-checkpoint writes random '
                         'weights into a new or empty folder. Add --force to replace the '
                         'checkpoint there (its weights, training.json, demos_manifest.json, '
                         'vla_spec_node.json and draft/ are removed)')
    stale = sorted(out.glob('model*.safetensors')) + [out / n for n in REPLACED_BY_MAKE_CHECKPOINT]
    for path in stale:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def cmd_make_checkpoint(args) -> int:
    from .models.registry import checkpoint_options, make_checkpoint
    shard = int(args.max_shard_mb * 2 ** 20) if args.max_shard_mb else None
    options = {'num_image_slots': args.image_slots, 'image_size': args.image_size,
               'state_dim': args.state_dim}
    given = [(name, value) for name, value in (
        ('--image-slots', args.image_slots), ('--image-size', args.image_size),
        ('--state-dim', args.state_dim), ('--decodable-chunks', args.decodable_chunks or None))
        if value is not None]
    if given and not set(options) <= set(checkpoint_options(args.preset)):
        raise ValueError(f'{given[0][0]}: only pi0fast-* presets take it ({args.preset} is '
                         'OpenVLA: one image, no state)')
    for name, value in given:
        if value is not True and value < 1:
            raise ValueError(f'{name}: must be >= 1, got {value}')
    _prepare_checkpoint_out(Path(args.out), args.force)
    out = make_checkpoint(args.preset, args.out, seed=args.seed, dtype=args.dtype,
                          max_shard_bytes=shard, decodable_chunks=args.decodable_chunks,
                          scripted_reasoning=args.scripted_reasoning, **options)
    print(f'wrote random-weight {args.preset} checkpoint (seed {args.seed}) to {out}')
    if args.decodable_chunks:
        extras = json.loads((out / 'vla_spec_pi0fast.json').read_text())['decodable']
        print('test aid: greedy decoding writes the same FAST frame for every observation, '
              f'tokens {extras["frame"]}, the normalised chunk '
              f'{np.round(extras["chunk"], 4).tolist()}')
    return 0


def _load_image(path: str | None, size: int, seed: int) -> np.ndarray:
    if path is None:
        return np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    import cv2
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise ValueError(f'--image: cannot read {path}')
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)


def _speculative_modes() -> tuple[str, ...]:
    return tuple(mode for mode in MODES if EngineConfig(mode=mode).is_speculative)


def cmd_predict(args) -> int:
    from .policy import VLAPolicy
    speculative = _speculative_modes()
    if args.relax_threshold > 0 and args.mode not in speculative:
        # EngineConfig takes it in any mode and only the speculative ones read it: typed
        # here with another mode, it would be ignored without a word.
        raise ValueError(f'--relax-threshold: {args.relax_threshold} bins given, but --mode '
                         f'{args.mode} accepts no drafts to relax; it applies to '
                         f'{" and ".join(speculative)}')
    policy = VLAPolicy.from_pretrained(args.model, mode=args.mode, device=args.device,
                                       dtype=args.dtype, draft_path=args.draft_path,
                                       relax_threshold=args.relax_threshold,
                                       restrict_to_action_tokens=args.restrict_to_action_tokens)
    image = _load_image(args.image, policy.model_config.image_size, args.seed)
    for i in range(args.repeat):
        result = policy.predict(image, args.instruction, args.unnorm_key)
        s = result.stats
        print(f'[{i}] tokens {list(result.tokens)}')
        if result.reasoning is not None:      # a reasoning policy: what it wrote first
            text = getattr(result.reasoning, 'text', result.reasoning)
            print(f'    reasoning  ({getattr(result.reasoning, "num_tokens", "?")} tokens) '
                  f'{text!r}')
        print(f'    normalized {np.round(result.normalized, 4).tolist()}')
        print(f'    action     {np.round(result.action, 5).tolist()} '
              f'(unnorm_key {s["unnorm_key"]})')
        reason = '' if result.is_valid else f' ({result.invalid_reason})'
        print(f'    valid {result.is_valid}{reason}')
        print(f'    mode {s["mode"]}, {s["forward_passes"]} verifier forwards, '
              f'latency {s["latency_s"] * 1e3:.1f} ms')
    return 0


def cmd_bench(args) -> int:
    from .bench import format_table, run_bench
    if args.threads < 0:
        raise ValueError(f'--threads: must be >= 0, got {args.threads}')
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    modes = [m.strip() for m in args.modes.split(',') if m.strip()]
    if not modes:
        raise ValueError(f'--modes: no mode given ({args.modes!r}); choose from '
                         f'{list(MODES) + ["hf"]}')
    bad = [m for m in modes if m not in MODES + ('hf',)]
    if bad:
        raise ValueError(f'--modes: unknown {bad}; choose from {list(MODES) + ["hf"]}')
    command = 'vla-spec ' + ' '.join(shlex.quote(a) for a in args.argv)
    tree = {name: getattr(args, name) for name in ('tree_depth', 'tree_top_k', 'tree_max_nodes',
                                                   'tree_min_prob')
            if getattr(args, name) is not None}
    if args.draft_previous_action:
        tree['draft_previous_action'] = True
    try:
        sweep = [int(v) for v in args.sweep_inflight.split(',')] if args.sweep_inflight else None
    except ValueError:
        raise ValueError(f'--sweep-inflight: expected comma-separated integers, got '
                         f'{args.sweep_inflight!r}') from None
    rows = run_bench(args.model or args.preset, modes, args.frames, args.warmup, args.device,
                     args.dtype, args.seed, args.draft_path, args.streams, args.out, command,
                     tree=tree, sweep_inflight=sweep, frame_source=args.frames_from,
                     max_prefills_per_step=args.max_prefills_per_step,
                     max_inflight=args.max_inflight)
    print(format_table(rows))
    return 0


def cmd_collect_demos(args) -> int:
    from .sim.demos import collect_demos
    from .sim.metaworld_env import sim_unavailable_reason
    reason = sim_unavailable_reason()
    if reason is not None:
        raise ValueError(f'the simulator is unavailable: {reason}')
    tasks = [t.strip() for t in args.tasks.split(',') if t.strip()]
    manifest = collect_demos(args.out, tasks, args.episodes_per_task, args.image_size,
                             args.seed, args.max_steps, True, args.camera,
                             action_noise=args.action_noise)
    print(json.dumps(manifest, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog='vla-spec', description=__doc__)
    sub = parser.add_subparsers(dest='command', required=True)

    p = sub.add_parser('make-checkpoint', help='write a random-weight checkpoint in its '
                       "family's layout (OpenVLA's Hugging Face layout; pi0fast-*: LeRobot's; "
                       "ecot-*: ECoT's, OpenVLA's with a Vicuna prompt)")
    p.add_argument('--preset', required=True, choices=sorted(PRESETS))
    p.add_argument('--out', required=True, help='a new or empty folder')
    p.add_argument('--force', action='store_true', help='write into a folder that holds '
                   'something: an old checkpoint\'s weights, training.json, '
                   'demos_manifest.json, vla_spec_node.json and draft/ are removed first')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--dtype', default='float32',
                   choices=['float32', 'float64', 'bfloat16', 'float16'])
    p.add_argument('--max-shard-mb', type=positive_float, default=None,
                   help='shard the weights (model.safetensors.index.json) at this size')
    p.add_argument('--image-slots', type=int, default=None,
                   help='pi0fast-*: cameras per frame (default: the preset\'s; the node\'s '
                   'image_slots may list up to this many)')
    p.add_argument('--image-size', type=int, default=None,
                   help='pi0fast-*: the SigLIP tower\'s image size in pixels, every slot '
                   '(LeRobot\'s image_resolution; default: the preset\'s)')
    p.add_argument('--state-dim', type=int, default=None,
                   help='pi0fast-*: values in the robot state (observation.state; default: the '
                   'preset\'s)')
    p.add_argument('--decodable-chunks', action='store_true',
                   help='pi0fast-*, a test aid: set the random weights so that greedy decoding '
                   'writes one valid FAST chunk (the same for every observation), so the node '
                   'acts on it; a random model\'s frames are otherwise almost never a chunk')
    p.add_argument('--scripted-reasoning', action='store_true',
                   help='ecot-*, a test aid: set the random weights so that greedy decoding '
                   'writes a short reasoning, ACTION: and 7 bins (nearly the same for every '
                   'observation); a random model otherwise never reaches its action')
    p.set_defaults(func=cmd_make_checkpoint)

    p = sub.add_parser('predict', help='predict one action for an image + instruction')
    p.add_argument('--model', default='metaworld-demo',
                   help='checkpoint folder, embedded model or preset name')
    p.add_argument('--image', default=None, help='image file (default: a seeded random image)')
    p.add_argument('--instruction', default='open the drawer')
    p.add_argument('--unnorm-key', default=None)
    p.add_argument('--mode', default='ar', choices=MODES)
    p.add_argument('--relax-threshold', type=int, default=0)
    p.add_argument('--restrict-to-action-tokens', action='store_true')
    p.add_argument('--repeat', type=at_least(1), default=1)
    p.add_argument('--seed', type=int, default=0)
    _add_engine_args(p)
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser('bench', help='speed per mode vs the Hugging Face AR baseline')
    p.add_argument('--preset', default='tiny')
    p.add_argument('--model', default=None, help='checkpoint folder (overrides --preset)')
    p.add_argument('--modes', default='hf,ar,pipeline')
    p.add_argument('--frames', type=at_least(1), default=30)
    p.add_argument('--frames-from', default='random',
                   choices=('random', 'metaworld', 'metaworld-episodes'),
                   help='random: uniform noise images; metaworld: held-out Meta-World '
                   'observations of the embedded model\'s tasks, the tasks in turn frame by '
                   'frame; metaworld-episodes: each stream consecutive control steps of one '
                   'task after another, as a robot\'s camera (both need the simulator)')
    p.add_argument('--warmup', type=at_least(0), default=3)
    p.add_argument('--streams', type=at_least(1), default=1,
                   help='cameras: frames go to the streams in turn, each stream has one '
                   'waiting whenever its previous frame was admitted')
    p.add_argument('--max-prefills-per-step', type=int, default=1,
                   help='waiting frames (of different streams) prefilled in one step in the '
                   'pipeline modes (EngineConfig.max_prefills_per_step)')
    p.add_argument('--max-inflight', type=int, default=None,
                   help='requests in flight in the pipeline modes (default: EngineConfig\'s); '
                   'with several prefills per step, about that many times action_dim lets '
                   'the pipeline admit them')
    p.add_argument('--threads', type=int, default=1,
                   help='torch CPU threads for every row, HF\'s included (default 1, as the '
                   'node\'s torch_threads; 0 = torch\'s default, one per core)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--out', default=None, help='write JSON + markdown results here')
    p.add_argument('--tree-depth', type=int, default=None,
                   help='draft tree depth of the speculative modes (default: EngineConfig)')
    p.add_argument('--tree-top-k', type=int, default=None)
    p.add_argument('--tree-max-nodes', type=int, default=None)
    p.add_argument('--tree-min-prob', type=float, default=None,
                   help='draft tree confidence pruning (EngineConfig.tree_min_prob)')
    p.add_argument('--draft-previous-action', action='store_true',
                   help='merge each stream\'s previous action into the draft head\'s trees '
                   '(EngineConfig.draft_previous_action)')
    p.add_argument('--sweep-inflight', default=None,
                   help='comma-separated max_inflight values: time pipeline steps at each, '
                   'with segment and dense attention')
    _add_engine_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser('collect-demos', help='scripted Meta-World demonstrations with images, '
                       'instructions, 7-dim actions and norm_stats')
    p.add_argument('--out', required=True)
    p.add_argument('--tasks', default='button-press-topdown,drawer-open,drawer-close,'
                   'window-open,window-close,handle-press')
    p.add_argument('--episodes-per-task', type=int, default=100)
    p.add_argument('--image-size', type=int, default=64)
    p.add_argument('--max-steps', type=int, default=150)
    p.add_argument('--camera', default='corner4')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--action-noise', type=float, default=0.0,
                   help='DART-style: executed position deltas get Gaussian noise of this '
                   'standard deviation (a fraction of the 1 cm step); labels stay the expert\'s')
    p.set_defaults(func=cmd_collect_demos)

    try:
        from .train import train_draft
    except ImportError:
        train_draft = None
    if train_draft is not None and hasattr(train_draft, 'add_arguments'):
        p = sub.add_parser('train-draft', help='train an EAGLE draft head on the verifier\'s '
                           'own greedy outputs')
        train_draft.add_arguments(p)
        p.set_defaults(func=train_draft.run)
    p = sub.add_parser('demo', help='the embedded Meta-World model closed-loop: lock-step '
                       'success per mode through the ROS 2 node, model-only speed against the '
                       'HF baseline, success against action delay (--full: the relaxation '
                       'sweep too)')
    from .harness import demo as demo_job
    from .harness import demo_options
    demo_options.add_arguments(p)
    p.set_defaults(func=demo_job.run)

    p = sub.add_parser('fidelity', help='how far float32 / bfloat16 runs are from a float64 '
                       'reference: pixels (against OpenVLA\'s processor), vision features, '
                       'action tokens')
    from . import fidelity
    fidelity.add_arguments(p)
    p.set_defaults(func=fidelity.run)

    p = sub.add_parser('train-demo-vla', help='train the embedded Meta-World model (and its '
                       'draft head) from scripted demonstrations')
    from .train import train_demo_vla
    train_demo_vla.add_arguments(p)
    p.set_defaults(func=train_demo_vla.run)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    args.argv = argv
    # A command that fails ends with one line and exit code 2: bad input (ValueError, a
    # CheckpointError, a JSONDecodeError), a file it cannot read or write (OSError) or a
    # failure while running (RuntimeError: a frame that fails at inference, torch refusing).
    # A programming error (TypeError, KeyError, ...) keeps its traceback.
    try:
        return int(args.func(args) or 0)
    except (ValueError, OSError, RuntimeError) as exc:
        print(f'vla-spec {args.command}: error: {_one_line(exc)}', file=sys.stderr)
        return 2


def _one_line(exc: BaseException) -> str:
    """An exception's message on one line (torch's run-time errors span several); its type
    when it has none."""
    text = ' '.join(line.strip() for line in str(exc).splitlines() if line.strip())
    return text or type(exc).__name__


if __name__ == '__main__':
    sys.exit(main())
