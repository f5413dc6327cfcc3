"""The engine's host-side shortcuts give what the plain paths give.

- ``ModelRunner.validate_instruction`` keeps the prompt ids of recent instructions: the same
  ids as the tokenizer, a fresh list per call, bad instructions still refused.
- A drafter that reads no verifier features (the previous action) is handed no prefix
  embeddings; one that does gets the prompt's and the accepted chain's, as before.
- A step of prefills only (spec's admission steps) skips the empty token embedding: its
  greedy tokens and hidden states equal those of the same rows fed through the general path.
"""
import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.device.step_inputs import PrefillRows, pack_step
from vla_spec_ros.engine.drafting.previous_action_drafter import PreviousActionDrafter
from vla_spec_ros.engine.engine import Engine
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.instruction import PromptError
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint

from helpers import serve_streams

ACTION_DIM = 7


@pytest.fixture(scope='module')
def policy(tmp_path_factory):
    from vla_spec_ros import VLAPolicy
    folder = make_checkpoint('tiny', tmp_path_factory.mktemp('host_paths') / 'tiny', seed=5)
    return VLAPolicy.from_pretrained(str(folder), dtype='float64')


def test_instruction_ids_are_the_tokenizers_in_a_fresh_list(policy):
    runner = policy.engine.runner
    for text in ('pick up the cup', 'open the drawer', 'pick up the cup'):
        ids = runner.validate_instruction(text)
        assert ids == runner.tokenizer.encode(text)
        ids.append(-1)                  # the caller's list: the cached ids stay as they were
        assert runner.validate_instruction(text) == runner.tokenizer.encode(text)
    for bad in ('', '   ', 7):
        with pytest.raises(PromptError):
            runner.validate_instruction(bad)


class RecordingDrafter(PreviousActionDrafter):
    """The previous-action drafter, recording the prefix embeddings each new request gets;
    ``needs_features`` as told."""

    def __init__(self, needs_features: bool):
        super().__init__(ACTION_DIM)
        self._needs_features = needs_features
        self.prefix_embeds = []

    @property
    def needs_features(self) -> bool:
        return self._needs_features

    def update(self, begins, advances, features):
        begins = list(begins)
        self.prefix_embeds += [(b.prefix_embeds, len(b.decided_before_root)) for b in begins]
        super().update(begins, advances, features)


def drifting_frames(num: int):
    """One camera whose scene drifts: later prefills accept none, part or all of their
    chain."""
    rng = np.random.default_rng(0)
    scene = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    frames = []
    for _ in range(num):
        frames.append(Frame(scene.copy(), 'pick up the cup', 'bridge_orig', 'cam'))
        scene = np.clip(scene.astype(int) + rng.integers(-40, 41, scene.shape), 0,
                        255).astype(np.uint8)
    return frames


@pytest.mark.parametrize('needs_features', [False, True])
def test_prefix_embeddings_only_for_a_drafter_that_reads_them(policy, needs_features):
    runner = policy.engine.runner
    drafter = RecordingDrafter(needs_features)
    engine = Engine(runner, policy.engine.norm_stats,
                    EngineConfig(mode='spec', dtype='float64'), draft=drafter)
    frames = drifting_frames(12)
    out = serve_streams(engine, frames)
    plain = Engine(runner, policy.engine.norm_stats, EngineConfig(mode='ar', dtype='float64'))
    assert [f.result.tokens for f in out] == [f.result.tokens
                                              for f in serve_streams(plain, frames)]
    # Requests that needed more than their prefill, some after accepting part of a chain.
    assert any(num_accepted for _, num_accepted in drafter.prefix_embeds)
    length = runner.prefix_len(runner.validate_instruction(frames[0].instruction))
    for embeds, num_accepted in drafter.prefix_embeds:
        if not needs_features:
            assert embeds is None
            continue
        assert embeds.shape == (length + num_accepted, runner.cfg.llm.hidden_size)


def test_a_prefill_only_step_reads_what_the_general_path_reads(policy):
    """The same chained prompt alone (the shortcut) and beside a segment (the general path:
    embeddings of the segment tokens, concatenations): equal tokens and hidden rows."""
    from vla_spec_ros.engine.device.step_inputs import chain_rows
    runner = policy.engine.runner
    cfg = EngineConfig(mode='spec', dtype='float64')
    prompt = runner.prepare_prompt(drifting_frames(1)[0], cfg).embeds
    length = prompt.shape[0]
    first, _ = runner.codec.action_token_range()
    chain = (first + 3, first + 4, first + 5)
    results = []
    for with_segment in (False, True):
        ring = runner.new_ring(400, cfg)
        segments = [chain_rows(200, 400, 0, [first, first + 1])] if with_segment else []
        step = pack_step([PrefillRows(0, 400, length, chain)], segments, ring.scratch_slot)
        with torch.inference_mode():
            tokens, hidden = ring.run(step, [prompt])
        reads = step.reads_per_prefill
        results.append((tokens[:reads], hidden[:length + len(chain)].clone()))
    assert results[0][0] == results[1][0]
    assert torch.equal(results[0][1], results[1][1])
