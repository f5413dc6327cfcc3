"""CUDA graphs (GPU only): graph replay gives exactly the eager tokens and the plain AR
reference's, in float64, in every mode (the verifier step and, in the speculative modes, the
EAGLE draft forwards over their padded shape buckets).

On CPU the engine runs the same static-buffer path that graphs replay
(engine/device/packed_forward.py keeps one set of step buffers per shape bucket on every device);
the CPU tests of every mode against the reference cover it. Here the capture and replay themselves
are checked.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import begin_one, propose_one
from reference import ar_reference_tokens

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason='CUDA graphs need a CUDA GPU')

INSTRUCTIONS = ('open the drawer', 'push the red block to the left', 'close it',
                'press the button', 'lift the bowl')


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('graphs') / 'tiny', seed=6)
    eager = VLAPolicy.from_pretrained(str(folder), dtype='float64', device='cuda')
    graphed = VLAPolicy.from_pretrained(str(folder), dtype='float64', device='cuda',
                                        use_cuda_graphs=True)
    rng = np.random.default_rng(3)
    frames = [Frame(rng.integers(0, 256, (48, 56, 3), dtype=np.uint8),
                    INSTRUCTIONS[i % len(INSTRUCTIONS)], 'bridge_orig', f'cam{i % 2}')
              for i in range(24)]
    return eager, graphed, frames, ar_reference_tokens(eager, frames)


def run_saturating_results(engine, frames) -> list:
    """Saturating camera: each frame offered once none waits; the results by request id."""
    pending, out = list(frames), {}
    while pending or engine.has_work():
        if pending and not engine.has_waiting():
            engine.submit(pending.pop(0))
        for fin in engine.step():
            assert fin.error is None, fin.error
            out[fin.request_id] = fin.result
    return [out[i] for i in sorted(out)]


def run_saturating(engine, frames):
    return [result.tokens for result in run_saturating_results(engine, frames)]


@pytest.mark.parametrize('mode', ['ar', 'pipeline', 'spec', 'pipeline_spec'])
def test_graph_replay_equals_eager_and_reference(setup, mode):
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    eager, graphed, frames, expected = setup
    for policy, use_graphs in ((eager, False), (graphed, True)):
        cfg = EngineConfig(mode=mode, dtype='float64', device='cuda',
                           use_cuda_graphs=use_graphs, draft_path='random', tree_depth=3,
                           tree_top_k=2, tree_max_nodes=6)
        runner = policy.engine.runner
        draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
        engine = Engine(runner, policy.engine.norm_stats, cfg, draft=draft)
        assert run_saturating(engine, frames) == expected, (mode, use_graphs)
        forward = engine.strategy.verifier.forward
        if use_graphs:
            # Steady state replays: far fewer captures than steps.
            assert forward.num_graph_captures >= 1
            assert forward.num_graph_replays > forward.num_graph_captures
            if draft is not None:         # draft forwards: padded buckets, graphed too
                assert draft.pad_shapes and draft.forward.num_graph_captures >= 1
                assert draft.forward.num_graph_replays > 0
        else:
            assert forward.num_graph_captures == 0
    assert sum(g.num_replays for g in graphed.engine.runner._vision_graphs.values()) > 0


@pytest.mark.parametrize('mode', ['pipeline', 'pipeline_spec'])
def test_graphs_captured_before_serving(setup, mode):
    """capture_graphs builds every step shape up front: serving then only replays, and the
    padding-only capture steps leave the tokens exact."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    _, graphed, frames, expected = setup
    cfg = EngineConfig(mode=mode, dtype='float64', device='cuda', use_cuda_graphs=True,
                       draft_path='random', tree_depth=3, tree_top_k=2, tree_max_nodes=6)
    runner = graphed.engine.runner
    draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
    engine = Engine(runner, graphed.engine.norm_stats, cfg, draft=draft)
    same = [i for i, f in enumerate(frames) if f.instruction == frames[0].instruction]
    assert engine.capture_graphs(frames[0]) > 0
    forward = engine.strategy.verifier.forward
    captured = forward.num_graph_captures
    assert run_saturating(engine, [frames[i] for i in same]) == [expected[i] for i in same]
    assert forward.num_graph_captures == captured
    assert forward.num_graph_replays > 0


LONG_INSTRUCTION = ('pick up the small red cup on the left side of the table and put it '
                    'gently into the large blue bowl right behind the green box, then push '
                    'the yellow block to the right edge of the shelf')


@pytest.mark.parametrize('mode', ['pipeline', 'pipeline_spec'])
def test_graphs_with_several_prefills_per_step(setup, mode):
    """Two streams always waiting, two prompts per step, from different 64-row prompt buckets:
    the replayed buckets with two prefill blocks give the reference tokens, and once every
    prompt length was captured before serving, serving captures nothing."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    from vla_spec_ros.engine.packed import PROMPT_ROWS_BUCKET
    from vla_spec_ros.engine.device.step_inputs import round_up
    eager, graphed, frames, expected = setup
    rng = np.random.default_rng(5)
    long_frames = [Frame(rng.integers(0, 256, (48, 56, 3), dtype=np.uint8), LONG_INSTRUCTION,
                         'bridge_orig', 'cam1') for _ in range(4)]
    mixed = [f for pair in zip(frames[:8:2], long_frames) for f in pair]     # cam0, cam1, ...
    reference = ar_reference_tokens(eager, mixed)
    runner = graphed.engine.runner
    buckets = {round_up(runner.prefix_len(runner.validate_instruction(f.instruction)),
                        PROMPT_ROWS_BUCKET) for f in mixed}
    assert len(buckets) == 2
    cfg = EngineConfig(mode=mode, dtype='float64', device='cuda', use_cuda_graphs=True,
                       max_prefills_per_step=2, draft_path='random', tree_depth=3,
                       tree_top_k=2, tree_max_nodes=6)
    draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
    engine = Engine(runner, graphed.engine.norm_stats, cfg, draft=draft)
    for frame in (mixed[0], mixed[1]):
        engine.capture_graphs(frame)
    forward = engine.strategy.verifier.forward
    captured = forward.num_graph_captures
    for f in mixed:
        engine.submit(f)
    out = {fin.request_id: fin.result.tokens for fin in engine.run_until_idle()}
    assert [out[i] for i in sorted(out)] == reference
    assert forward.num_graph_captures == captured
    assert forward.num_graph_replays > 0


@pytest.mark.parametrize('mode', ['pipeline', 'pipeline_spec'])
def test_ring_attention_in_graphs_gives_the_reference_tokens(setup, mode):
    """``attention_backend: ring`` (the segment attention kernel, compiled for the GPU) inside
    the verifier's and the drafter's CUDA graphs: the reference tokens in float64, steps
    replayed, and the kernel in both the verifier's and the drafter's bundle."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    _, graphed, frames, expected = setup
    runner = graphed.engine.runner
    cfg = EngineConfig(mode=mode, dtype='float64', device='cuda', use_cuda_graphs=True,
                       attention_backend='ring', draft_path='random', tree_depth=3,
                       tree_top_k=2, tree_max_nodes=6)
    draft = load_draft_for(runner, cfg, None) if cfg.is_speculative else None
    engine = Engine(runner, graphed.engine.norm_stats, cfg, draft=draft)
    assert engine.strategy.verifier.kernels.segment_attention is not None
    if draft is not None:
        assert draft.kernels.segment_attention is not None
    assert run_saturating(engine, frames) == expected
    assert engine.strategy.verifier.forward.num_graph_replays > 0


def test_graphed_draft_forwards_equal_eager(setup):
    """Graph replay of the padded draft forwards gives the trees of the same padded shapes
    run eagerly, bit for bit (padding itself is checked against tight shapes on CPU)."""
    from vla_spec_ros.engine.drafting.eagle_drafter import EagleDrafter
    from vla_spec_ros.models.draft import new_draft_head
    eager_policy, _, frames, _ = setup
    runner = eager_policy.engine.runner
    head = new_draft_head(runner.model, seed=5)
    prompt = runner.prepare_prompt(frames[0], eager_policy.config)
    features = torch.randn(prompt.embeds.shape, dtype=prompt.embeds.dtype, device='cuda')
    trees = []
    for use_graphs in (False, True):
        drafter = EagleDrafter(runner, head, use_cuda_graphs=use_graphs, pad_shapes=True)
        begin_one(drafter, 0, prompt.embeds, features, 7)
        trees.append([propose_one(drafter, 0, 3, 2, 6) for _ in range(3)])
        if use_graphs:
            assert drafter.forward.num_graph_replays > 0
    assert trees[0] == trees[1]


def test_graphs_refused_off_cuda():
    with pytest.raises(ValueError, match='use_cuda_graphs'):
        EngineConfig(device='cpu', use_cuda_graphs=True)
    with pytest.raises(ValueError, match='use_cuda_graphs'):
        EngineConfig(device='cuda', use_cuda_graphs=True, attention_backend='dense')


@pytest.mark.parametrize('mode', ['spec', 'pipeline_spec'])
def test_previous_action_drafting_in_graphs_gives_the_reference_tokens(setup, mode):
    """Temporal drafting (``draft_path: previous_action``, no draft forward) with the verifier
    graphed at the chain's tree size (``tree_max_nodes`` 6): each scene shown three times in a
    row, the reference tokens, graphs replayed, and the repeats accepted from the previous
    action."""
    from vla_spec_ros.engine.drafting.draft_choice import load_draft_for
    eager, graphed, frames, expected = setup
    picks = [i for i in range(6) for _ in range(3)]
    stream = [Frame(frames[i].image, frames[i].instruction, frames[i].unnorm_key, 'cam')
              for i in picks]
    runner = graphed.engine.runner
    cfg = EngineConfig(mode=mode, dtype='float64', device='cuda', use_cuda_graphs=True,
                       draft_path='previous_action', tree_depth=5, tree_max_nodes=6)
    engine = Engine(runner, graphed.engine.norm_stats, cfg,
                    draft=load_draft_for(runner, cfg, None))
    engine.capture_graphs(stream[0])
    results = run_saturating_results(engine, stream)
    assert [r.tokens for r in results] == [expected[i] for i in picks]
    assert engine.strategy.verifier.forward.num_graph_replays > 0
    assert min(r.stats['forward_passes'] for r in results) < 7
