"""Reasoning every N-th frame (``reasoning_every_n``, engine/reasoning_reuse.py): the lossy
option beside the exact default. A reused frame's output is the kept reasoning (the last fresh
frame's text, marker and separator), then the greedy action given the prompt and that text,
in float64 in every mode; N = 1 forces nothing; models without reasoning refuse N > 1."""
import dataclasses

import pytest
import torch

from vla_spec_ros.engine.ar import run_ar
from vla_spec_ros.engine.drafting.acceptance import accept
from vla_spec_ros.engine.drafting.draft_tree import chain_tree
from vla_spec_ros.engine.reasoning_reuse import ReasoningReuse
from vla_spec_ros.models import registry

from helpers import serve_streams
from test_ecot import drifting_frames

MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return registry.make_checkpoint('ecot-tiny', tmp_path_factory.mktemp('reuse') / 'ck',
                                    seed=0, scripted_reasoning=True)


def policy(folder, **options):
    from vla_spec_ros import VLAPolicy
    return VLAPolicy.from_pretrained(str(folder), dtype='float64', **options)


def forced_reference(runner, config, frame, forced):
    """The greedy continuation after the prompt and the forced tokens (dense AR, private
    cache): the tokens a reused frame must end with."""
    prompt = runner.prepare_prompt(frame, config)
    ids = torch.tensor(forced, dtype=torch.long, device=prompt.embeds.device)
    prefix = torch.cat([prompt.embeds, runner.embed_tokens(ids).to(prompt.embeds.dtype)])
    rest = runner.codec.max_tokens - len(forced)
    tokens, _ = run_ar(runner, prefix, rest)
    return tuple(forced) + runner.codec.cut(tuple(forced), tokens)


@pytest.mark.parametrize('mode', MODES)
def test_a_reused_frame_is_the_kept_text_then_the_greedy_action(folder, mode):
    frames = drifting_frames(9, 1)
    p = policy(folder, mode=mode, reasoning_every_n=3)
    out = sorted(serve_streams(p.engine, [dataclasses.replace(f) for f in frames]),
                 key=lambda f: f.request_id)
    codec, runner = p.engine.runner.codec, p.engine.runner
    reused = [f.result.stats['reasoning_reused'] for f in out]
    assert any(reused) and not reused[0]
    kept = None
    for fin, was_reused in zip(out, reused):
        tokens = fin.result.tokens
        if was_reused:
            assert tokens[:len(kept)] == kept
            assert tokens == forced_reference(runner, p.config, fin.frame, kept)
        else:
            # A fresh frame is greedy decoding's, whatever came before it.
            want = forced_reference(runner, p.config, fin.frame, ())
            assert tokens == want
            kept = codec.reasoning_prefix(tokens)
        assert fin.result.is_valid
    # At most N - 1 reused frames follow a fresh one.
    runs = ''.join('R' if r else 'f' for r in reused).split('f')
    assert max(len(r) for r in runs) <= 2


def test_every_n_of_one_forces_nothing(folder):
    frames = drifting_frames(6, 1)
    a = policy(folder, mode='pipeline_spec')
    b = policy(folder, mode='pipeline_spec', reasoning_every_n=1)
    ra = [f.result.tokens for f in sorted(serve_streams(a.engine, frames),
                                          key=lambda f: f.request_id)]
    rb = [f.result for f in sorted(serve_streams(b.engine, [dataclasses.replace(f)
                                                            for f in frames]),
                                   key=lambda f: f.request_id)]
    assert [r.tokens for r in rb] == ra
    assert not any(r.stats['reasoning_reused'] for r in rb)


def test_a_model_without_reasoning_refuses_it(tmp_path, folder):
    from vla_spec_ros import VLAPolicy
    with pytest.raises(ValueError, match='reasoning_every_n'):
        VLAPolicy.from_pretrained('tiny', reasoning_every_n=2)
    tiny = VLAPolicy.from_pretrained('tiny')
    with pytest.raises(ValueError, match='reasoning_every_n'):
        tiny.engine.set_tunables(reasoning_every_n=4)
    p = policy(folder)
    p.engine.set_tunables(reasoning_every_n=4)          # a tunable: the next frames use it
    assert p.config.reasoning_every_n == 4


def test_forced_tokens_override_the_verifier_then_verification_resumes():
    # A chain root -> 5 -> 6 -> 7 -> 8; the verifier disagrees everywhere but at node 3.
    tree = chain_tree(100, (5, 6, 7, 8))
    argmax = [9, 9, 7, 9, 9]
    exact = dict(relax_threshold=0, is_action_token=lambda t: False, token_to_bin=int)
    assert accept(tree, argmax, **exact).emitted_tokens == (9,)
    # Forced 5, 6: accepted unverified; node 3 (7) is the verifier's: accepted; node 4 is not.
    acc = accept(tree, argmax, forced=(5, 6), **exact)
    assert acc.accepted_tokens == (5, 6, 7) and acc.bonus_token == 9
    # Forced past the path's end: the bonus is the next forced token, not the verifier's.
    acc = accept(tree, argmax, forced=(5, 42, 43), **exact)
    assert acc.accepted_tokens == (5,) and acc.bonus_token == 42
    # A root-only tree (AR) emits the forced token.
    root = chain_tree(100, ())
    assert accept(root, [9], forced=(3,), **exact).emitted_tokens == (3,)


def test_the_counter_reuses_n_minus_one_frames_after_a_fresh_one():
    reuse = ReasoningReuse()
    assert reuse.forced_for('a', 3) == ()                 # nothing kept: fresh
    reuse.observe('a', (1, 2), was_forced=False)
    got = [reuse.forced_for('a', 3) for _ in range(6)]
    assert got == [(1, 2), (1, 2), (), (1, 2), (1, 2), ()]
    reuse.observe('a', None, was_forced=False)            # a fresh frame without an action
    assert reuse.forced_for('a', 3) == ()
    assert reuse.forced_for('b', 1) == ()
    reuse.observe('a', (4,), was_forced=False)
    reuse.forget('a')
    assert reuse.forced_for('a', 3) == ()


def test_the_kept_text_holds_for_its_context_only_and_n_of_one_forgets_it():
    """A kept reasoning is reused only under the context it was reasoned in (the node: the
    instruction and the statistics): before, a new instruction's frames acted on the old
    task's reasoning. N = 1 forgets it, so turning reuse back on reasons afresh."""
    reuse = ReasoningReuse()
    drawer, button = ('open the drawer', 'k'), ('press the button', 'k')
    assert reuse.forced_for('a', 3, drawer) == ()
    reuse.observe('a', (1, 2), was_forced=False, context=drawer)
    assert reuse.forced_for('a', 3, drawer) == (1, 2)
    assert reuse.forced_for('a', 3, button) == ()           # another instruction: fresh
    reuse.observe('a', (7,), was_forced=False, context=button)
    assert reuse.forced_for('a', 3, button) == (7,)
    assert reuse.forced_for('a', 1, button) == ()           # N = 1: forgotten ...
    assert reuse.forced_for('a', 3, button) == ()           # ... so N = 3 starts afresh


def test_a_frame_replaced_before_it_started_does_not_count(folder):
    """The reuse is decided when a frame starts: before, it was counted at submission, so
    the frames a newer one replaced (a camera faster than the engine, the node's
    replace_waiting) used up the count, and a robot acted on one reasoning for many more than
    N - 1 frames (8 in a row with N = 4 at 30 Hz)."""
    p = policy(folder, mode='pipeline_spec', reasoning_every_n=2)
    engine = p.engine
    reused = []
    for frame in drifting_frames(8, 1):
        for _ in range(2):                  # one replaced before the engine steps at all
            engine.replace_waiting(dataclasses.replace(frame))
        (done,) = engine.run_until_idle()
        reused.append(done.result.stats['reasoning_reused'])
    assert reused == [False, True] * 4
