"""``vla-spec train-draft`` on the tiny preset: data, packing, learning, resume, DDP.

The learning check measures the trained head the way the engine uses it (through
``EagleDrafter`` on verifier features computed here with one plain causal forward), against the
same head before training: teacher-forced top-1 agreement on the positions the verifier asks
for (a2..a7) and the accepted length of a free-running 6-token draft chain.
"""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_spec_ros import VLAPolicy
from vla_spec_ros.config import EngineConfig
from vla_spec_ros.engine.ar import causal_batch, decode_ar
from vla_spec_ros.engine.drafting.eagle_drafter import EagleDrafter
from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models.draft import load_draft, new_draft_head
from vla_spec_ros.models.openvla.random_checkpoint import make_checkpoint
from vla_spec_ros.train import train_draft
from vla_spec_ros.train.draft_data import (DraftDataset, DraftSample, load_observations,
                                           pack_samples)

from helpers import advance_one, begin_one, propose_one

INSTRUCTIONS = ['pick up the red block', 'open the top drawer', 'push the blue button',
                'close the cabinet door', 'put the cup on the plate', 'lift the green bowl',
                'slide the box to the left', 'press the white button']
# Enough to learn the tiny verifier's outputs on 8 observations in a few seconds.
FAST = ['--batch-size', '8', '--lr', '5e-3', '--warmup-steps', '10', '--noise', '0.02',
        '--no-progress', '--log-every', '10']


@pytest.fixture(scope='module')
def checkpoint(tmp_path_factory):
    return make_checkpoint('tiny', tmp_path_factory.mktemp('ckpt') / 'tiny', seed=0)


@pytest.fixture(scope='module')
def observations(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp('obs') / 'obs.npz'
    images = rng.integers(0, 256, (len(INSTRUCTIONS), 40, 50, 3), dtype=np.uint8)
    np.savez(path, images=images, instructions=np.array(INSTRUCTIONS))
    return path


@pytest.fixture(scope='module')
def runner(checkpoint):
    return VLAPolicy.from_pretrained(str(checkpoint)).engine.runner


@pytest.fixture(scope='module')
def trained(checkpoint, observations, tmp_path_factory):
    out = tmp_path_factory.mktemp('trained') / 'draft'
    args = train_draft.build_parser().parse_args(
        ['--model', str(checkpoint), '--data', str(observations), '--out', str(out),
         '--steps', '150', '--save-every', '50', *FAST])
    return out, train_draft.train_from_args(args)


def train(argv):
    return train_draft.train_from_args(train_draft.build_parser().parse_args(argv))


# ---- observations ---------------------------------------------------------------------------

def test_observation_formats(tmp_path, observations):
    import cv2
    obs = load_observations(observations)
    assert len(obs) == len(INSTRUCTIONS) and obs[2][1] == INSTRUCTIONS[2]
    image = np.random.default_rng(1).integers(0, 256, (20, 30, 3), dtype=np.uint8)
    cv2.imwrite(str(tmp_path / 'b.png'), image[:, :, ::-1])
    cv2.imwrite(str(tmp_path / 'a.png'), image[::-1, :, ::-1])
    (tmp_path / 'instructions.jsonl').write_text(
        json.dumps({'image': 'b.png', 'instruction': 'open the door'}) + '\n')
    folder = load_observations(tmp_path)
    assert len(folder) == 1 and folder[0][1] == 'open the door'
    assert np.array_equal(folder[0][0], image)              # PNG is lossless, RGB order kept
    (tmp_path / 'instructions.jsonl').unlink()
    (tmp_path / 'instructions.txt').write_text('push the button\n')
    folder = load_observations(tmp_path)
    assert [folder[i][1] for i in range(2)] == ['push the button'] * 2
    assert np.array_equal(folder[0][0], image[::-1])        # name order: a.png first


def test_observation_errors(tmp_path):
    np.savez(tmp_path / 'objects.npz', images=np.zeros((2, 4, 4, 3), np.uint8),
             instructions=np.array(['a', None], dtype=object))
    with pytest.raises(ValueError, match='pickle'):
        load_observations(tmp_path / 'objects.npz')
    np.savez(tmp_path / 'count.npz', images=np.zeros((2, 4, 4, 3), np.uint8),
             instructions=np.array(['a', 'b', 'c']))
    with pytest.raises(ValueError, match='2 images but 3 instructions'):
        load_observations(tmp_path / 'count.npz')
    np.savez(tmp_path / 'dtype.npz', images=np.zeros((2, 4, 4, 3), np.float32),
             instructions=np.array(['a', 'b']))
    with pytest.raises(ValueError, match='uint8'):
        load_observations(tmp_path / 'dtype.npz')
    empty = tmp_path / 'empty'
    empty.mkdir()
    with pytest.raises(ValueError, match='instructions'):
        load_observations(empty)
    (empty / 'instructions.jsonl').write_text('{"image": "missing.png", "instruction": "x"}\n')
    with pytest.raises(ValueError, match='does not exist'):
        load_observations(empty)


# ---- packing ----------------------------------------------------------------------------------

def test_pack_samples_by_hand():
    """L=3, A=3: draft positions 0..3, loss on positions 2..3 predicting a2, a3."""
    def sample(base, tokens):
        embeds = torch.arange(3.0)[:, None].repeat(1, 2) + base               # e_0..e_2
        features = torch.arange(5.0)[:, None].repeat(1, 2) + base + 0.5       # f_0..f_4
        return DraftSample(embeds, features, torch.tensor(tokens))

    def embed(ids):
        return ids[:, None].float().repeat(1, 2) * 100

    packed = pack_samples([sample(0, [5, 6, 7]), sample(10, [8, 9, 4])], embed, 'cpu',
                          torch.float32)
    col = packed.inputs_embeds[:, 0].tolist()
    assert col == [1, 2, 500, 600, 11, 12, 800, 900]                         # e_{p+1}
    assert packed.features[:, 0].tolist() == [0.5, 1.5, 2.5, 3.5, 10.5, 11.5, 12.5, 13.5]
    assert packed.loss_rows.tolist() == [2, 3, 6, 7]
    assert packed.targets[:, 0].tolist() == [3.5, 4.5, 13.5, 14.5]          # f_L..f_{L+1}
    assert packed.target_tokens.tolist() == [6, 7, 9, 4]
    assert packed.batch.positions.tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    expected = torch.zeros(8, 8, dtype=torch.bool)
    for block in (range(0, 4), range(4, 8)):
        for q in block:
            for k in block:
                expected[q, k] = k <= q
    assert torch.equal(packed.batch.attn_mask, expected)


# ---- data generation --------------------------------------------------------------------------

def test_generated_data_is_the_ar_reference(trained, contexts):
    data = DraftDataset(trained[0] / 'train' / 'data')
    assert len(data) == len(contexts)
    for i, (embeds, tokens, features) in enumerate(contexts):
        sample = data[i]
        assert sample.tokens.tolist() == tokens
        assert torch.equal(sample.prefix_embeds, embeds)
        torch.testing.assert_close(sample.features, features, rtol=1e-5, atol=1e-5)


# ---- learning ---------------------------------------------------------------------------------

@pytest.fixture(scope='module')
def contexts(runner, observations):
    """Per observation: prefix embeddings, AR tokens, verifier features f_0..f_{L+5}."""
    out = []
    obs = load_observations(observations)
    with torch.no_grad():
        for i in range(len(obs)):
            image, instruction = obs[i]
            embeds = runner.prepare_prompt(Frame(image, instruction), EngineConfig()).embeds
            tokens, _ = decode_ar(runner, embeds, runner.max_action_tokens)
            # One causal forward over the prefix + a1..a6 (not incremental decoding).
            full = torch.cat([embeds, runner.embed_tokens(torch.tensor(tokens[:-1]))])
            features = runner.forward(full, causal_batch(0, full.shape[0], runner.device),
                                      runner.new_cache(full.shape[0]))
            out.append((embeds, tokens, features))
    return out


@torch.no_grad()
def measure(runner, head, contexts):
    """(teacher-forced top-1 agreement on a2..a7, mean accepted length of a 6-token chain)."""
    drafter = EagleDrafter(runner, head)
    hits = total = 0
    accepted = []
    for rid, (embeds, tokens, features) in enumerate(contexts):
        length = embeds.shape[0]
        begin_one(drafter, rid, embeds, features[:length], tokens[0])
        chain = propose_one(drafter, rid, 6, 1, 7).tokens[1:]
        num = 0
        while num < len(chain) and chain[num] == tokens[num + 1]:
            num += 1
        accepted.append(num)
        for j in range(1, runner.max_action_tokens):    # root a_j: the draft predicts a_{j+1}
            hits += propose_one(drafter, rid, 1, 1, 2).tokens[1] == tokens[j]
            total += 1
            advance_one(drafter, rid, [tokens[j - 1]], features[length + j - 1:length + j],
                        tokens[j])
        drafter.release(rid)
    return hits / total, float(np.mean(accepted))


def test_training_raises_agreement_with_the_verifier(trained, runner, contexts):
    out, summary = trained
    first, last = summary['first_batch'], summary['last_batch']
    # The soft cross-entropy cannot fall below the verifier's own entropy (near log(vocab) for
    # a random model), so the feature loss and the top-1 agreement carry the signal.
    assert last['loss'] < first['loss'] and last['p_loss'] < first['p_loss']
    assert last['v_loss'] < 0.2 * first['v_loss']
    assert last['top1'] > first['top1'] + 0.5
    untrained = new_draft_head(runner.model, seed=0)        # the head training started from
    head = load_draft(out, runner.model)
    before, before_len = measure(runner, untrained, contexts)
    after, after_len = measure(runner, head, contexts)
    print(f'top-1 agreement untrained {before:.3f} trained {after:.3f}; '
          f'chain accepted length untrained {before_len:.2f} trained {after_len:.2f} of 6; '
          f'training report {summary["train_top1_agreement"]:.3f}')
    assert after >= before + 0.6
    assert after_len >= before_len + 3.0
    assert summary['train_top1_agreement'] == pytest.approx(after, abs=0.1)


def test_resume_continues_exactly(trained, checkpoint, observations, tmp_path):
    out, _ = trained
    work = tmp_path / 'work'
    shutil.copytree(out / 'train' / 'data', work / 'data')      # reuse the generated data
    argv = ['--model', str(checkpoint), '--data', str(observations), '--work-dir', str(work),
            '--steps', '12', '--save-every', '6', *FAST]
    full = train(argv + ['--out', str(tmp_path / 'full')])
    assert full['start_step'] == 0
    checkpoints = sorted(p.name for p in (work / 'checkpoints').iterdir())
    assert checkpoints == ['step-0000006', 'step-0000012']
    shutil.rmtree(work / 'checkpoints' / 'step-0000012')
    resumed = train(argv + ['--out', str(tmp_path / 'resumed'), '--resume'])
    assert resumed['start_step'] == 6
    a = (tmp_path / 'full' / 'model.safetensors').read_bytes()
    b = (tmp_path / 'resumed' / 'model.safetensors').read_bytes()
    assert a == b


def test_bad_training_options(checkpoint, observations, tmp_path):
    with pytest.raises(ValueError, match='batch_size'):
        train(['--model', str(checkpoint), '--data', str(observations), '--out',
               str(tmp_path / 'x'), '--batch-size', '0'])


@pytest.mark.parametrize('option, value', [('--lr', 'inf'), ('--lr', 'nan'),
                                           ('--grad-clip', 'inf'), ('--noise', 'inf')])
def test_non_finite_rates_are_refused(checkpoint, observations, tmp_path, option, value):
    """Before: --lr inf trained, wrote a head of NaN weights and exited 0."""
    name = option[2:].replace('-', '_')
    with pytest.raises(ValueError, match=f'{name}: must be a finite number'):
        train(['--model', str(checkpoint), '--data', str(observations), '--out',
               str(tmp_path / 'x'), option, value])
    assert not (tmp_path / 'x').exists()


def test_a_non_finite_loss_stops_training_before_anything_is_written(
        trained, checkpoint, observations, tmp_path, monkeypatch):
    from vla_spec_ros.train.divergence import TrainingDiverged
    work = tmp_path / 'work'
    shutil.copytree(trained[0] / 'train' / 'data', work / 'data')   # reuse the generated data
    calls = []

    def diverging_loss(*args, **kwargs):        # the third step's loss is NaN
        loss, stats = real_loss(*args, **kwargs)
        calls.append(1)
        if len(calls) == 3:
            loss = loss * float('nan')
            stats = {**stats, 'loss': float('nan')}
        return loss, stats

    real_loss = train_draft.draft_loss
    monkeypatch.setattr(train_draft, 'draft_loss', diverging_loss)
    out = tmp_path / 'head'
    with pytest.raises(TrainingDiverged, match='step 3: the loss is nan'):
        train(['--model', str(checkpoint), '--data', str(observations), '--work-dir',
               str(work), '--out', str(out), '--steps', '5', '--save-every', '2', *FAST])
    assert not out.exists()                     # no final head
    saved = sorted(p.name for p in (work / 'checkpoints').iterdir())
    assert saved == ['step-0000002']            # the last finite weights only
    head = load_draft(work / 'checkpoints' / saved[0], VLAPolicy.from_pretrained(
        str(checkpoint)).engine.runner.model)
    assert all(torch.isfinite(v).all() for v in head.state_dict().values())


def test_ddp_two_processes_match_one(trained, checkpoint, observations, runner, tmp_path):
    """torchrun, 2 CPU processes (gloo) x batch 2 == 1 process x batch 4 (noise off)."""
    work = tmp_path / 'ddp'
    common = ['--model', str(checkpoint), '--data', str(observations), '--steps', '3',
              '--lr', '3e-3', '--warmup-steps', '1', '--noise', '0', '--no-progress']
    env = {**os.environ, 'OMP_NUM_THREADS': '1'}
    cmd = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc-per-node',
           '2', '-m', 'vla_spec_ros.train.train_draft', *common, '--batch-size', '2',
           '--work-dir', str(work), '--out', str(tmp_path / 'ddp_out')]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-3000:]
    data = DraftDataset(work / 'data')          # generated by both ranks, 4 samples each
    assert len(data) == len(INSTRUCTIONS)
    assert sorted(p.name for p in (work / 'data').glob('shard-*')) == [
        'shard-r000-00000.safetensors', 'shard-r001-00000.safetensors']
    single = tmp_path / 'single'
    shutil.copytree(work / 'data', single / 'data')
    train(common + ['--batch-size', '4', '--work-dir', str(single), '--out',
                    str(tmp_path / 'single_out')])
    a = load_draft(tmp_path / 'ddp_out', runner.model)
    b = load_draft(tmp_path / 'single_out', runner.model)
    for key, value in a.state_dict().items():
        torch.testing.assert_close(value, b.state_dict()[key], rtol=1e-4, atol=1e-5)


# ---- where the head is written ----------------------------------------------------------------

def _files(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_out_that_holds_a_model_is_refused_and_left_alone(checkpoint, observations, tmp_path,
                                                          capsys):
    """Before: ``--out`` = ``--model`` (or any checkpoint folder) got the head's config.json
    and model.safetensors written over the model's, after the whole run."""
    from vla_spec_ros import cli
    copy = tmp_path / 'model_copy'
    shutil.copytree(checkpoint, copy)
    errors = []
    for out in (checkpoint, copy):
        before = _files(out)
        code = cli.main(['train-draft', '--model', str(checkpoint), '--data', str(observations),
                         '--out', str(out), '--steps', '1', '--no-progress'])
        err = capsys.readouterr().err
        assert code == 2 and 'Traceback' not in err and '--force' in err, err
        assert _files(out) == before and not (out / 'train').exists()
        errors.append(err)
    assert 'is the --model checkpoint folder' in errors[0]
    assert 'holds model weights' in errors[1]


def test_a_draft_head_is_retrained_in_place_and_force_overwrites_a_model(
        trained, checkpoint, observations, tmp_path):
    work = tmp_path / 'work'
    shutil.copytree(trained[0] / 'train' / 'data', work / 'data')   # reuse the generated data
    argv = ['--model', str(checkpoint), '--data', str(observations), '--work-dir', str(work),
            '--steps', '2', *FAST]
    head = tmp_path / 'head'
    train(argv + ['--out', str(head)])
    first = _files(head)
    train(argv + ['--out', str(head), '--seed', '1'])          # a head folder: overwritten
    assert _files(head).keys() == first.keys() and _files(head) != first
    copy = tmp_path / 'model_copy'
    shutil.copytree(checkpoint, copy)
    train(argv + ['--out', str(copy), '--force'])
    assert json.loads((copy / 'config.json').read_text())['architectures'] == ['EagleDraftHead']
