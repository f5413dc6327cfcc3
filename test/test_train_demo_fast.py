"""``train-demo-vla --family pi0fast`` (models/pi0fast/demo_training.py, prefix_lm_forcing.py):
the teacher-forced prefix-LM forward equals the engine's AR decode in float64, the mask, and a
few training steps on a synthetic demo set give a checkpoint the family loads."""
import numpy as np
import pytest
import torch

from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import reference_tokens
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models import registry
from vla_spec_ros.models.pi0fast import demo_training as fast_recipe
from vla_spec_ros.models.pi0fast.prefix_lm_forcing import (pixel_values_pi0fast,
                                                           prefix_lm_batch, prefix_lm_logits)
from vla_spec_ros.sim.demos import DemoSet
from vla_spec_ros.train import train_demo_vla
from vla_spec_ros.train.demo_training import train_model

TEXTS = ['Pick up the red cup', 'open the drawer', 'put the block on the plate now']


def test_the_mask_is_bidirectional_over_the_prefix_and_causal_after_it():
    ids, prefix_lens, mask, target, rows = prefix_lm_batch([[2, 5], [2, 5, 6, 7]],
                                                           [[10, 11, 12], [20, 21]], 3, 0)
    assert ids.tolist() == [[2, 5, 10, 11, 0], [2, 5, 6, 7, 20]]
    assert prefix_lens.tolist() == [5, 7]
    assert target.tolist() == [[10, 11, 12], [20, 21, -100]]
    assert rows.tolist() == [[4, 5, 6], [6, 7, 7]]
    m = mask[0, 0]
    assert m[0, :5].all() and not m[0, 5:].any()          # a patch row sees the whole prefix
    assert m[5, :6].all() and not m[5, 6:].any()          # a generated row: prefix + itself
    assert not mask[0, 0, :, 7].any()                     # a pad key is seen by no row


def test_teacher_forced_logits_equal_the_engine_ar_forward(tmp_path):
    loaded = registry.load(registry.make_checkpoint('pi0fast-tiny', tmp_path / 'ck', seed=3),
                           torch.float64)
    config = EngineConfig(dtype='float64', mode='ar')
    runner = ModelRunner(loaded.model, loaded.cfg, loaded.tokenizer, config, codec=loaded.codec)
    rng = np.random.default_rng(0)
    frames = [Frame(rng.integers(0, 256, (28, 28, 3), dtype=np.uint8), text, 'synthetic', 's',
                    state=rng.uniform(-1, 1, 4)) for text in TEXTS]
    tokens = reference_tokens(runner, frames, config)
    assert len(set(tokens)) == 3
    ids, _, mask, target, rows = prefix_lm_batch([runner.frame_prompt_ids(f) for f in frames],
                                                 tokens, loaded.cfg.num_patches, 0)
    pixels = pixel_values_pi0fast(torch.from_numpy(np.stack([f.image for f in frames])),
                                  torch.float64)
    for image, row in zip((f.image for f in frames), pixels):
        torch.testing.assert_close(row, loaded.model.preprocess(torch.from_numpy(image)),
                                   rtol=0, atol=1e-12)
    with torch.no_grad():
        logits = prefix_lm_logits(loaded.model, pixels, ids, mask, rows)
    for i, frame_tokens in enumerate(tokens):
        assert logits[i, :len(frame_tokens)].argmax(-1).tolist() == list(frame_tokens)


def synthetic_demos(num_episodes=4, length=12, size=64, seed=0) -> DemoSet:
    rng = np.random.default_rng(seed)
    n = num_episodes * length
    t = np.arange(n) % length
    actions = np.stack([np.sin(t / 3 + k) for k in range(6)] + [np.where(t > 5, 1.0, -1.0)],
                       axis=1).astype(np.float32)
    q01, q99 = actions.min(0).tolist(), actions.max(0).tolist()
    stats = {'metaworld_scripted': {'action': {'q01': q01, 'q99': q99, 'mean': [0.0] * 7,
                                               'std': [1.0] * 7, 'min': q01, 'max': q99,
                                               'mask': [True] * 6 + [False]},
                                    'num_transitions': n, 'num_trajectories': num_episodes}}
    return DemoSet(images=rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
                   actions=actions, instructions=np.array(['open the drawer'] * n),
                   episode_index=np.repeat(np.arange(num_episodes), length).astype(np.int32),
                   task_index=np.zeros(n, dtype=np.int32), task_names=('drawer-open',),
                   norm_stats=stats)


def test_a_few_steps_write_a_checkpoint_the_family_loads(tmp_path):
    cfg = train_demo_vla.DemoTrainConfig(steps=2, batch_size=4, log_every=1, save_every=10,
                                         val_every_nth_episode=2, chunk=8, family='pi0fast')
    report = train_model(cfg, synthetic_demos(), tmp_path / 'out', tmp_path / 'work',
                         resume=False)
    assert report['final']['step'] == 2 and 'val_token_accuracy' in report['final']
    loaded = registry.load(tmp_path / 'out', torch.float32)
    assert loaded.family == 'pi0fast'
    assert loaded.codec.action_shape == (8, 7)
    assert loaded.model.style == fast_recipe.STYLE == 'openpi'
    assert loaded.cfg.max_action_tokens == report['fast']['frame_tokens']['max'] + \
        fast_recipe.FRAME_MARGIN


def test_init_from_continues_the_trained_model_with_its_tokenizers_and_statistics(tmp_path):
    """``init_from``: the first checkpoint's weights, text and FAST tokenizers and statistics
    carry over (not refitted on the new demonstrations), so its ids keep their meaning."""
    import json

    from safetensors.torch import load_file
    demos = synthetic_demos()
    first_cfg = train_demo_vla.DemoTrainConfig(steps=1, batch_size=4, log_every=1,
                                               val_every_nth_episode=2, chunk=8,
                                               family='pi0fast')
    train_model(first_cfg, demos, tmp_path / 'first', tmp_path / 'w1')
    shifted = DemoSet(demos.images, demos.actions * 1.5, demos.instructions,
                      demos.episode_index, demos.task_index, demos.task_names,
                      {'other': {'action': {k: (np.asarray(v) * 3).tolist() if k != 'mask' else v
                                            for k, v in demos.norm_stats[
                                                next(iter(demos.norm_stats))]['action'].items()}}})
    cfg = train_demo_vla.DemoTrainConfig(steps=1, batch_size=4, log_every=1, lr=1e-12,
                                         warmup_steps=0, val_every_nth_episode=2, chunk=8,
                                         family='pi0fast', init_from=str(tmp_path / 'first'))
    report = train_model(cfg, shifted, tmp_path / 'second', tmp_path / 'w2')
    assert report['init_from'] == str(tmp_path / 'first')
    first, second = tmp_path / 'first', tmp_path / 'second'
    assert (json.loads((second / 'dataset_statistics.json').read_text())
            == json.loads((first / 'dataset_statistics.json').read_text()))
    assert ((second / 'tokenizer.json').read_text() == (first / 'tokenizer.json').read_text())
    for name in sorted(p.name for p in (first / fast_recipe.FAST_TOKENIZER_FOLDER).iterdir()):
        assert ((second / fast_recipe.FAST_TOKENIZER_FOLDER / name).read_bytes()
                == (first / fast_recipe.FAST_TOKENIZER_FOLDER / name).read_bytes())
    a, b = load_file(first / 'model.safetensors'), load_file(second / 'model.safetensors')
    assert a.keys() == b.keys()
    for key in a:      # one step at lr 1e-12 moves a weight by at most about 1e-12
        torch.testing.assert_close(a[key], b[key], atol=1e-9, rtol=0)
    wrong = train_demo_vla.DemoTrainConfig(steps=1, batch_size=4, chunk=4, family='pi0fast',
                                           val_every_nth_episode=2,
                                           init_from=str(tmp_path / 'first'))
    with pytest.raises(ValueError, match='chunks of 8'):
        train_model(wrong, demos, tmp_path / 'third', tmp_path / 'w3')
