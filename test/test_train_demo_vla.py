"""Training the embedded model: tokenizer, teacher-forced forward, action normalisation, and a
short end-to-end `train-demo-vla` run on a synthetic dataset in `collect-demos` format."""
import json

import numpy as np
import pytest
import torch

from vla_spec_ros.actions import ActionStats
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import run_ar
from vla_spec_ros.engine.device.runner import ModelRunner
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.openvla.action_bins import ActionTokenizer
from vla_spec_ros.models.openvla.checkpoint import build_model
from vla_spec_ros.models.openvla.preprocess import preprocess_image
from vla_spec_ros.models.openvla.prompt import PromptTokenizer, build_instruction_tokenizer
from vla_spec_ros.models.registry import preset
from vla_spec_ros.sim.metaworld_env import TASKS
from vla_spec_ros.models.openvla.teacher_forcing import (action_logits, build_sequences,
                                                         pixel_values_batch)
from vla_spec_ros.train import train_demo_vla as tdv
from vla_spec_ros.train.demo_training import lr_at, random_shift

INSTRUCTIONS = sorted({text for task in TASKS for text in task.instructions})


@pytest.fixture(scope='module')
def tokenizer():
    cfg = preset('metaworld-demo')
    return PromptTokenizer(build_instruction_tokenizer(INSTRUCTIONS, cfg.pad_token_id,
                                                       cfg.n_action_bins))


def test_instruction_tokenizer_keeps_action_ids_free(tokenizer):
    cfg = preset('metaworld-demo')
    actions = ActionTokenizer(cfg.llm.vocab_size, cfg.pad_to_multiple_of, cfg.n_action_bins)
    tok = tokenizer.tokenizer
    assert tok.token_to_id('<PAD>') == cfg.pad_token_id
    for text in INSTRUCTIONS:
        ids = tokenizer.encode(text)
        assert max(ids) < actions.first_action_id, text
        assert tok.token_to_id('<unk>') not in ids, text
        assert tok.decode(ids).strip().endswith('Out:')
    for token_id in range(actions.first_action_id, actions.last_action_id + 1):
        assert tok.id_to_token(token_id).startswith('<unused_')


def test_instruction_tokenizer_refuses_a_vocabulary_that_does_not_fit():
    with pytest.raises(ValueError, match='reserved'):
        build_instruction_tokenizer(INSTRUCTIONS, 40, 20)
    with pytest.raises(ValueError, match='instructions'):
        build_instruction_tokenizer([], 512, 256)


def test_pixel_values_batch_equals_inference_preprocessing():
    cfg = preset('metaworld-demo')
    images = np.random.default_rng(0).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    batch = pixel_values_batch(torch.from_numpy(images), cfg)
    for i, image in enumerate(images):
        torch.testing.assert_close(batch[i], preprocess_image(image, cfg), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match='64 x 64'):
        pixel_values_batch(torch.zeros(1, 32, 32, 3, dtype=torch.uint8), cfg)


def test_teacher_forced_logits_equal_the_engine_ar_forward(tokenizer):
    """Same weights, float64: the batched training forward and the engine's AR decode agree on
    every logit at the 7 action positions (teacher-forcing the AR's own tokens)."""
    cfg = preset('metaworld-demo')
    model = build_model(cfg, torch.float64, 'cpu', seed=3)
    engine_cfg = EngineConfig(dtype='float64')
    runner = ModelRunner(model, cfg, tokenizer, engine_cfg)
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    texts = [INSTRUCTIONS[0], INSTRUCTIONS[5], INSTRUCTIONS[-1]]   # different lengths
    prompt_ids, ar_tokens, ar_logits = [], [], []
    for image, text in zip(images, texts):
        prompt = runner.prepare_prompt(Frame(image, text, None, 's'), engine_cfg)
        tokens, features = run_ar(runner, prompt.embeds, 7)
        prefix_len = prompt.embeds.shape[0]
        ar_logits.append(runner.lm.logits(features[prefix_len - 1:]))
        ar_tokens.append(tokens)
        prompt_ids.append(prompt.input_ids)
    assert len({len(ids) for ids in prompt_ids}) > 1
    ids, text_lens = build_sequences(prompt_ids, np.array(ar_tokens), cfg.pad_token_id)
    pixels = pixel_values_batch(torch.from_numpy(images), cfg, torch.float64)
    logits = action_logits(model, pixels, ids, text_lens, 7)
    for i in range(3):
        torch.testing.assert_close(logits[i], ar_logits[i], rtol=1e-9, atol=1e-9)
    assert logits.argmax(-1).tolist() == ar_tokens


def test_normalize_actions_inverts_unnormalize_and_handles_zero_span_dims():
    stats = ActionStats(q01=np.array([-0.01, -0.02, 0.0, 0.0]),
                        q99=np.array([0.01, 0.02, 0.0, 1.0]),
                        mask=np.array([True, True, True, False]))
    actions = np.array([[0.005, -0.02, 0.0, 1.0], [-0.01, 0.01, 0.0, 0.0],
                        [0.5, -0.5, 0.0, 0.0]])
    normalized = stats.normalize(actions)
    np.testing.assert_allclose(normalized, [[0.5, -1.0, 0.0, 1.0], [-1.0, 0.5, 0.0, 0.0],
                                            [1.0, -1.0, 0.0, 0.0]])
    np.testing.assert_allclose(stats.unnormalize(normalized[0]), actions[0], atol=1e-12)
    assert np.all(np.isfinite(normalized))


def test_random_shift_moves_content_and_zero_shift_is_identity():
    images = torch.from_numpy(
        np.random.default_rng(2).integers(0, 256, (4, 16, 16, 3), dtype=np.uint8))
    gen = torch.Generator().manual_seed(0)
    assert torch.equal(random_shift(images, 0, gen), images)
    shifted = random_shift(images, 2, gen)
    assert shifted.shape == images.shape and shifted.dtype == torch.uint8
    padded = torch.nn.functional.pad(images.permute(0, 3, 1, 2).float(), [2] * 4,
                                     mode='replicate')
    for i in range(4):     # each output is one of the 25 crops of its replicate-padded input
        crops = [padded[i, :, t:t + 16, s:s + 16].permute(1, 2, 0).to(torch.uint8)
                 for t in range(5) for s in range(5)]
        assert any(torch.equal(shifted[i], c) for c in crops)


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    cfg = tdv.DemoTrainConfig(steps=100, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    lrs = [lr_at(s, cfg) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[100] == pytest.approx(1e-4)
    with pytest.raises(ValueError, match='steps'):
        tdv.DemoTrainConfig(steps=0)


def _write_synthetic_demos(folder, num_episodes=4, length=6):
    """A dataset in collect-demos' format whose action depends on the image brightness."""
    from vla_spec_ros.sim.demos import MANIFEST_FILE, STATISTICS_FILE, action_norm_stats
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (num_episodes * length, 64, 64, 3), dtype=np.uint8)
    actions = np.zeros((len(images), 7), dtype=np.float32)
    actions[:, 0] = np.where(images.mean(axis=(1, 2, 3)) > 127.5, 0.01, -0.01)
    actions[:, 6] = rng.integers(0, 2, len(images))
    texts = np.array([INSTRUCTIONS[i % 3] for i in range(len(images))])
    episode_index = np.repeat(np.arange(num_episodes, dtype=np.int32), length)
    folder.mkdir()
    np.savez(folder / 'drawer-open.npz', images=images, actions=actions, instructions=texts,
             episode_index=episode_index, step_index=np.tile(np.arange(length), num_episodes))
    (folder / STATISTICS_FILE).write_text(json.dumps(
        {'metaworld_scripted': action_norm_stats(actions, num_episodes)}))
    (folder / MANIFEST_FILE).write_text(json.dumps(
        {'tasks': {'drawer-open': {'file': 'drawer-open.npz'}}}))


def _train_args(data, out, steps, resume=False, draft_steps=0):
    from vla_spec_ros.cli import build_parser
    argv = ['train-demo-vla', '--data', str(data), '--out', str(out), '--steps', str(steps),
            '--batch-size', '4', '--log-every', '2', '--save-every', '2', '--warmup-steps', '2',
            '--val-every-nth-episode', '4', '--draft-steps', str(draft_steps),
            '--draft-samples', '8', '--threads', '1']
    args = build_parser().parse_args(argv + (['--resume'] if resume else []))
    args.argv = argv
    return args


def test_train_demo_vla_end_to_end_writes_a_loadable_checkpoint_and_resumes(tmp_path):
    from safetensors.torch import load_file

    from vla_spec_ros.policy import VLAPolicy
    data = tmp_path / 'demos'
    _write_synthetic_demos(data)
    full = tmp_path / 'full'
    assert tdv.run(_train_args(data, full, 4, draft_steps=2)) == 0
    report = json.loads((full / tdv.REPORT_FILE).read_text())
    assert report['vla']['final']['step'] == 4 and 'val_token_accuracy' in report['vla']['final']
    assert (full / 'draft' / 'config.json').is_file()

    policy = VLAPolicy.from_pretrained(str(full), mode='spec')
    image = np.zeros((64, 64, 3), dtype=np.uint8)
    result = policy.predict(image, INSTRUCTIONS[0])
    assert result.action.shape == (7,) and result.stats['unnorm_key'] == 'metaworld_scripted'

    # 2 steps, then resume to 4: the same weights as 4 steps in one go (sampler, augmentation
    # and optimizer state all travel in last.pt).
    half = tmp_path / 'half'
    assert tdv.run(_train_args(data, half, 2)) == 0
    assert tdv.run(_train_args(data, half, 4, resume=True)) == 0
    a, b = load_file(str(full / 'model.safetensors')), load_file(str(half / 'model.safetensors'))
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0)


def test_non_finite_learning_rates_are_refused():
    """Before: lr inf was accepted, training wrote NaN weights and exited 0."""
    for field in ('lr', 'grad_clip', 'min_lr_ratio', 'weight_decay'):
        for value in (float('inf'), float('nan')):
            with pytest.raises(ValueError, match=f'{field}: must be a finite number'):
                tdv.DemoTrainConfig(**{field: value})


def test_a_non_finite_loss_stops_the_loop_before_the_weights_change(tmp_path):
    """The third step's loss is NaN: fit stops before its optimizer step, and the state saved
    every step holds the second step's finite weights."""
    from vla_spec_ros.train.demo_training import TRAIN_STATE, fit
    from vla_spec_ros.train.divergence import TrainingDiverged

    class Recipe:
        model = torch.nn.Linear(3, 1)
        images = torch.zeros(8, 4, 4, 3, dtype=torch.uint8)
        train_index = np.arange(8)
        steps = 0

        def batch_loss(self, index, images):
            self.steps += 1
            loss = self.model(torch.ones(len(index), 3)).pow(2).mean()
            return loss * (float('nan') if self.steps == 3 else 1.0), 0.0

        def summary(self):
            return 'a linear model'

        def evaluate(self):
            return {}

    cfg = tdv.DemoTrainConfig(steps=5, batch_size=2, warmup_steps=0, log_every=1,
                              save_every=1, max_shift=0)
    recipe = Recipe()
    with pytest.raises(TrainingDiverged, match='step 3'):
        fit(recipe, cfg, tmp_path, resume=False)
    assert all(torch.isfinite(p).all() for p in recipe.model.parameters())
    state = torch.load(tmp_path / TRAIN_STATE, weights_only=False)
    assert state['step'] == 2
