"""The embedded default model shipped in vla_spec_ros/assets/metaworld-demo.

It is part of the package: these tests fail (not skip) when it is missing or broken. The
closed-loop tests need the simulator and skip with its reason where it cannot render.
"""
import json

import numpy as np

from vla_spec_ros import assets
from vla_spec_ros.models.registry import preset
from vla_spec_ros.policy import VLAPolicy

from expert_frames import drawer_close_frames

NAME = 'metaworld-demo'
MAX_ASSET_BYTES = 20 * 2 ** 20


def _folder():
    folder = assets.embedded_checkpoint(NAME)
    assert folder is not None, f'the embedded model {NAME} is missing from {assets.ROOT}'
    return folder


def test_embedded_model_is_complete_small_and_loads_through_the_openvla_loader():
    folder = _folder()
    for name in ('config.json', 'model.safetensors', 'dataset_statistics.json',
                 'tokenizer.json', 'training.json', 'draft/config.json',
                 'draft/model.safetensors'):
        assert (folder / name).is_file(), name
    total = sum(p.stat().st_size for p in folder.rglob('*') if p.is_file())
    assert total < MAX_ASSET_BYTES
    policy = VLAPolicy.from_pretrained(NAME)
    assert policy.model_config == preset(NAME)
    assert policy.unnorm_keys == ('metaworld_scripted',)
    report = json.loads((folder / 'training.json').read_text())
    assert report['vla']['final']['step'] == report['config']['steps']


def test_default_commands_use_the_embedded_model():
    from vla_spec_ros.cli import build_parser
    parser = build_parser()
    assert parser.parse_args(['predict']).model == NAME
    assert parser.parse_args(['demo']).model == NAME


def test_strict_speculative_decoding_reproduces_ar_on_simulator_frames():
    """float64, r = 0: the trained draft changes how many forwards run, never the tokens."""
    frames = drawer_close_frames(12)
    ar = VLAPolicy.from_pretrained(NAME, dtype='float64')
    spec = VLAPolicy.from_pretrained(NAME, dtype='float64', mode='spec')
    instruction = 'close the drawer'
    forwards = []
    for image in frames:
        expected = ar.predict(image, instruction)
        got = spec.predict(image, instruction)
        assert got.tokens == expected.tokens
        assert expected.is_valid
        forwards.append(got.stats['forward_passes'])
    assert np.mean(forwards) < 7      # the trained draft is accepted at least sometimes


def test_previous_action_drafting_on_consecutive_simulator_frames():
    """float64, r = 0, the expert's path one control step apart (what a robot's camera sees):
    temporal drafting gives exactly the AR tokens, and the previous frame's action is accepted
    often enough that a frame takes fewer verifier forwards than the head-less AR's 7 (with no
    draft forward at all)."""
    frames = drawer_close_frames(12)
    ar = VLAPolicy.from_pretrained(NAME, dtype='float64')
    temporal = VLAPolicy.from_pretrained(NAME, dtype='float64', mode='spec',
                                         draft_path='previous_action', tree_depth=5)
    instruction = 'close the drawer'
    forwards = []
    for image in frames:
        got = temporal.predict(image, instruction)
        assert got.tokens == ar.predict(image, instruction).tokens
        forwards.append(got.stats['forward_passes'])
    assert temporal.engine.strategy.drafter.num_forward_passes == 0
    assert forwards[0] == 7                 # the first frame has no previous action
    assert np.mean(forwards[1:]) < 4


def test_shipped_model_closes_the_drawer_in_the_simulator():
    """Behaviour, not numbers: the model drives the arm to success on held-out placements of
    its easiest task (in process; the ROS path is test_closed_loop.py)."""
    drawer_close_frames(0)      # skip where the simulator cannot render
    from vla_spec_ros.sim.demos import evaluate_policy
    policy = VLAPolicy.from_pretrained(NAME)
    results = evaluate_policy('drawer-close', lambda image, text: policy.predict(image, text)
                              .action, episodes=2, seed=1000, image_size=64)
    assert any(r.is_success for r in results), results
