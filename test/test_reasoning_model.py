"""The embedded reasoning model (``metaworld-demo-reason``, ECoT's layout trained on the
scripted demonstrations with reasoning from the expert's state): every strict mode gives AR's
tokens, reasoning text and action in float64 on consecutive control steps of Meta-World
episodes (1 and 3 robots, the budget hit and not), a relaxed threshold changes only the
action's bins, and the default mode decides a step in a few verifier forwards."""
import dataclasses

import numpy as np
import pytest

from vla_spec_ros.engine.result import Frame
from vla_spec_ros.sim.metaworld_env import sim_unavailable_reason

from helpers import serve_streams

SIM_REASON = sim_unavailable_reason()
pytestmark = pytest.mark.skipif(SIM_REASON is not None, reason=f'simulator: {SIM_REASON}')
MODEL = 'metaworld-demo-reason'
MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')


def policy(**options):
    from vla_spec_ros import VLAPolicy
    return VLAPolicy.from_pretrained(MODEL, dtype='float64', **options)


@pytest.fixture(scope='module')
def frames():
    """Consecutive control steps of the scripted expert: 6 of drawer-open, then 6 of
    window-close (a new task: a new instruction and scene), placements of test seeds."""
    from vla_spec_ros.sim.metaworld_env import get_task, make_env
    out = []
    for name, seed in (('drawer-open', 3001), ('window-close', 3002)):
        task = get_task(name)
        with make_env(name, seed=seed, image_size=64) as env:
            images = [env.reset(seed)]
            for _ in range(15):
                image, _, done, _ = env.step(env.expert_action())
                images.append(image)
                if done:
                    break
        out += [Frame(image, task.instructions[0], 'metaworld_scripted', 'robot0')
                for image in images[-6:]]
    return out


def as_streams(frames, num_streams):
    return [dataclasses.replace(f, stream_id=f'robot{i % num_streams}')
            for i, f in enumerate(frames)]


def results_of(engine, frames):
    out = serve_streams(engine, [dataclasses.replace(f) for f in frames])
    return [f.result for f in sorted(out, key=lambda f: f.request_id)]


@pytest.mark.parametrize('budget, num_streams', [(0, 1), (0, 3), (20, 2)])
def test_every_mode_gives_ars_tokens_text_and_action(frames, budget, num_streams):
    options = {'max_reasoning_tokens': budget} if budget else {}
    stream = as_streams(frames, num_streams)
    reference = results_of(policy(mode='ar', **options).engine, stream)
    assert all(not r.is_valid for r in reference) if budget else all(
        r.is_valid for r in reference)
    for mode in MODES[1:]:
        got = results_of(policy(mode=mode, **options).engine, stream)
        for g, want in zip(got, reference):
            assert g.tokens == want.tokens, mode
            assert g.reasoning.text == want.reasoning.text
            assert g.invalid_reason == want.invalid_reason
            np.testing.assert_array_equal(g.action, want.action)
    if not budget:
        fields = reference[0].reasoning.fields
        assert {'task', 'plan', 'subtask', 'move', 'gripper_position'} <= set(fields)


def test_relaxation_changes_only_the_actions_bins(frames):
    """r = 8: the reasoning (text, marker, separator) stays AR's token for token; only the 7
    bins after it may differ (each accepted bin within r of the verifier's own token at its
    position, whose later tokens then follow from it: acceptance's own tests check that)."""
    ar = results_of(policy(mode='ar').engine, frames)
    relaxed = results_of(policy(mode='pipeline_spec', relax_threshold=8).engine, frames)
    codec = policy(mode='ar').engine.runner.codec
    for got, want in zip(relaxed, ar):
        assert codec.reasoning_prefix(got.tokens) == codec.reasoning_prefix(want.tokens)
        assert len(got.tokens) == len(want.tokens) and got.is_valid


def test_the_default_decides_consecutive_steps_in_a_few_forwards(frames):
    ar = results_of(policy(mode='ar').engine, frames)
    default = results_of(policy().engine, frames)
    ar_forwards = np.mean([r.stats['forward_passes'] for r in ar])
    # After each task's first two frames (no previous output of the task yet).
    forwards = np.mean([r.stats['forward_passes'] for r in default[2:6] + default[8:]])
    assert ar_forwards == np.mean([len(r.tokens) for r in ar])              # one per token
    assert forwards < 0.35 * ar_forwards, (forwards, ar_forwards)
