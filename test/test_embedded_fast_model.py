"""The embedded pi0-FAST model shipped in vla_spec_ros/assets/metaworld-demo-fast.

Part of the package: fails (not skips) when missing or broken. The frame tests need the
simulator and skip with its reason where it cannot render.
"""
import json

import numpy as np

from vla_spec_ros import assets
from vla_spec_ros.policy import VLAPolicy

from expert_frames import drawer_close_frames

NAME = 'metaworld-demo-fast'
MAX_ASSET_BYTES = 12 * 2 ** 20


def _folder():
    folder = assets.embedded_checkpoint(NAME)
    assert folder is not None, f'the embedded model {NAME} is missing from {assets.ROOT}'
    return folder


def test_it_is_complete_small_and_loads_as_pi0fast():
    folder = _folder()
    for name in ('config.json', 'model.safetensors', 'dataset_statistics.json',
                 'training.json'):
        assert (folder / name).is_file(), name
    total = sum(p.stat().st_size for p in folder.rglob('*') if p.is_file())
    assert total < MAX_ASSET_BYTES
    policy = VLAPolicy.from_pretrained(NAME)
    cfg = policy.model_config
    assert (cfg.chunk_size, cfg.action_dim, cfg.image_size) == (8, 7, 64)
    assert policy.engine.runner.codec.action_shape == (8, 7)
    assert policy.unnorm_keys == ('metaworld_scripted',)
    report = json.loads((folder / 'training.json').read_text())
    assert report['vla']['family'] == 'pi0fast'
    assert report['vla']['final']['step'] == report['config']['steps']
    # Fitted on the first model's training episodes; the shipped model continued that model
    # with its tokenizers (docs/demo.md), so its record says where they came from.
    fitted_on = report['vla']['fast']['fitted_on']
    assert fitted_on == 'training episodes only' or (
        report['vla']['init_from'] and fitted_on == f"copied from {report['vla']['init_from']}")


def test_its_chunks_on_meta_world_frames_decode_and_spec_gives_ar_tokens():
    from vla_spec_ros.harness.speed import engine_for
    images = drawer_close_frames(6)
    policy = VLAPolicy.from_pretrained(NAME)
    instruction = 'close the drawer'
    expected = []
    for image in images:
        result = policy.predict(image, instruction)
        assert result.is_valid and result.action.shape == (8, 7)
        assert np.all(np.isfinite(result.action))
        expected.append(result.tokens)
    for draft in (None, 'previous_action', 'shifted_chunk'):
        engine = engine_for(policy, 'spec', draft)
        assert _tokens_in_turn(engine, images, instruction) == expected, draft


def test_drafts_continued_by_coefficient_give_ar_tokens_in_fewer_forwards():
    """float64, 40 consecutive expert frames, the default drafts in both speculative modes:
    the tokens are AR's. The same drafts continued by token position (the codec's
    continuation switched off) take more verifier forwards on these frames: a decided token
    that spells another stretch of coefficients than the draft's no longer leaves the rest
    of the draft off by one piece."""
    from vla_spec_ros.harness.speed import engine_for
    from vla_spec_ros.testing import continue_drafts_by_position
    images = drawer_close_frames(40)
    instruction = 'close the drawer'
    policy = VLAPolicy.from_pretrained(NAME, mode='ar', dtype='float64')
    expected = [policy.predict(image, instruction).tokens for image in images]
    by_position = VLAPolicy.from_pretrained(NAME, mode='ar', dtype='float64')
    assert not by_position.engine.runner.codec.positional_drafts
    continue_drafts_by_position(by_position.engine.runner.codec)
    for mode in ('spec', 'pipeline_spec'):
        forwards = {}
        for label, loaded in (('coefficient', policy), ('position', by_position)):
            engine = engine_for(loaded, mode)
            assert _tokens_in_turn(engine, images, instruction) == expected, (mode, label)
            forwards[label] = engine.num_verifier_forwards
        assert forwards['coefficient'] < forwards['position'], (mode, forwards)


def _tokens_in_turn(engine, images, instruction) -> list:
    """Each image's tokens, the images submitted one after another as consecutive control
    steps of one robot."""
    from vla_spec_ros.engine.result import Frame
    tokens = []
    for step, image in enumerate(images):
        request_id = engine.submit(Frame(image, instruction, None, 'robot', control_step=step))
        done = {f.request_id: f for f in engine.run_until_idle()}
        tokens.append(done[request_id].result.tokens)
    return tokens
