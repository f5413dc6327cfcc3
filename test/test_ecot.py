"""The ECoT family (models/ecot/): its checkpoints through the registry, its prompt and
letterbox pixels, its reasoning's fields, and the engine on long variable-length outputs.

Expected values are written out by hand (the prompt string, the padded pixels, the parsed
fields) or come from the AR reference run through the same weights in float64: every strict
mode must give AR's tokens, reasoning text and action, with the reasoning budget hit (a random
model never writes ``ACTION:``) and not hit (the scripted test aid, models/ecot/scripted.py).
"""
import dataclasses
import json

import numpy as np
import pytest

from vla_spec_ros.engine.result import Frame
from vla_spec_ros.models import registry
from vla_spec_ros.models.ecot.letterbox import letterbox, pad_to_square
from vla_spec_ros.models.ecot.reasoning_text import parse_reasoning

from helpers import serve_streams
from reference import ar_reference_tokens

MODES = ('ar', 'pipeline', 'spec', 'pipeline_spec')
INSTRUCTION = 'Put the cup on the plate'
UNNORM_KEY = 'bridge_orig'


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp('ecot')
    return {'random': registry.make_checkpoint('ecot-tiny', root / 'random', seed=2),
            'scripted': registry.make_checkpoint('ecot-tiny', root / 'scripted', seed=0,
                                                 scripted_reasoning=True)}


def policy(folder, **options):
    from vla_spec_ros import VLAPolicy
    return VLAPolicy.from_pretrained(str(folder), dtype='float64', **options)


def drifting_frames(num, num_streams, seed=0):
    """``num`` frames over ``num_streams`` cameras: each camera's scene repeats, then drifts
    by a little noise (a robot's consecutive frames)."""
    rng = np.random.default_rng(seed)
    scenes = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(num_streams)]
    frames = []
    for i in range(num):
        stream = i % num_streams
        if i // num_streams % 3 == 2:
            noise = rng.integers(-4, 5, scenes[stream].shape)
            scenes[stream] = np.clip(scenes[stream].astype(int) + noise, 0, 255).astype(np.uint8)
        frames.append(Frame(scenes[stream].copy(), INSTRUCTION, UNNORM_KEY, f'cam{stream}'))
    return frames


# ---- the checkpoint, the prompt, the pixels ---------------------------------------------------

def test_ecot_checkpoints_are_found_by_their_config(folders):
    raw = json.loads((folders['random'] / 'config.json').read_text())
    assert raw['llm_backbone_id'] == 'vicuna-v15-7b'
    assert raw['image_resize_strategy'] == 'letterbox'
    assert raw['use_fused_vision_backbone'] is False
    assert registry.family_of(raw) == 'ecot'
    assert registry.family_of_preset('ecot-tiny') == 'ecot'
    assert registry.family_of_preset('tiny') == 'openvla'
    loaded = registry.load(folders['random'])
    assert loaded.family == 'ecot' and loaded.cfg.max_reasoning_tokens == 256


def test_the_released_policys_config_reads_as_one_siglip_tower_letterboxed():
    # config.json as the Hugging Face port of ecot-openvla-7b-bridge writes it (no
    # vla_spec_vision: the towers come from the timm ids).
    from vla_spec_ros.models.ecot.checkpoint import config_from_raw
    raw = {'architectures': ['OpenVLAForActionPrediction'], 'model_type': 'openvla',
           'vision_backbone_id': 'siglip-vit-so400m', 'llm_backbone_id': 'vicuna-v15-7b',
           'arch_specifier': 'no-align+gelu-mlp', 'use_fused_vision_backbone': False,
           'image_resize_strategy': 'letterbox', 'image_sizes': [224],
           'timm_model_ids': ['vit_so400m_patch14_siglip_224'],
           'timm_override_act_layers': [None], 'n_action_bins': 256, 'pad_to_multiple_of': 64,
           'pad_token_id': 32000, 'llm_max_length': 2048, 'norm_stats': {}}
    assert registry.family_of(raw) == 'ecot'
    cfg = config_from_raw(raw)
    assert cfg.featurizer.kind == 'siglip' and cfg.fused_featurizer is None
    assert cfg.image_size == 224 and cfg.num_patches == 256
    assert cfg.image_resize_strategy == 'letterbox' and cfg.max_reasoning_tokens == 1024
    assert cfg.llm.vocab_size == 32064 and cfg.llm.num_layers == 32
    # OpenVLA's own config is still OpenVLA's.
    assert registry.family_of({**raw, 'llm_backbone_id': 'llama2-7b-pure'}) == 'openvla'


def test_the_prompt_is_vicunas_chat_ending_with_task(folders):
    from vla_spec_ros.models.ecot.prompt import EcotPrompt, format_prompt
    assert format_prompt('Put the Cup on the plate') == (
        'A chat between a curious user and an artificial intelligence assistant. The '
        "assistant gives helpful, detailed, and polite answers to the user's questions. USER: "
        'What action should the robot take to put the cup on the plate? ASSISTANT: TASK:')
    prompt = EcotPrompt.from_folder(folders['random'])
    ids = prompt.encode(INSTRUCTION)
    assert ids[0] == prompt.bos_id and ids[-1] != prompt.space_id     # no "▁" appended
    assert prompt.decode(ids).endswith('ASSISTANT: TASK:')
    assert prompt.decode(prompt.marker_ids()).strip() == 'ACTION:'


def test_letterbox_pads_with_the_mean_then_resizes():
    image = np.arange(2 * 4 * 3, dtype=np.uint8).reshape(2, 4, 3)
    padded = pad_to_square(image, (127, 127, 127))
    # int((4 - 2) / 2) = 1 row of 127 above and below.
    assert padded.shape == (4, 4, 3)
    assert (padded[0] == 127).all() and (padded[3] == 127).all()
    assert (padded[1:3] == image).all()
    # An odd difference leaves the padded image one row short: 3 x 4 -> int(1/2) = 0 rows.
    assert pad_to_square(np.zeros((3, 4, 3), np.uint8), (127, 127, 127)).shape == (3, 4, 3)
    # Resized: shorter side 3 -> 4, longer int(4 * 4 / 3) = 5, then the centre 4 x 4.
    assert letterbox(np.zeros((3, 4, 3), np.uint8), 4, (127, 127, 127)).shape == (4, 4, 3)
    # A square frame is only resized (Pillow's bicubic, as OpenVLA's processor).
    from vla_spec_ros.models.openvla.preprocess import resize_bicubic
    square = np.random.default_rng(0).integers(0, 256, (30, 30, 3), dtype=np.uint8)
    assert (letterbox(square, 14, (127, 127, 127)) == resize_bicubic(square, 14)).all()


def test_the_reasoning_fields_parse_as_ecot_writes_them():
    generated = ('Move the wooden arch onto the table. PLAN: Reach for the arch. Grasp it. '
                 'VISIBLE OBJECTS: wooden blocks [150, 4, 188, 100], a towel [1, 2, 30, 40] '
                 'SUBTASK REASONING: The arch must be reached first. SUBTASK: Reach for the '
                 'arch. MOVE REASONING: The arm is above it. MOVE: move down GRIPPER '
                 'POSITION: [97, 45, 97, 45, 89, 52]')
    r = parse_reasoning(generated, num_tokens=60)
    assert r.text.startswith('TASK: Move the wooden arch')
    assert r.fields == {'task': 'Move the wooden arch onto the table.',
                        'plan': 'Reach for the arch. Grasp it.',
                        'visible_objects': 'wooden blocks [150, 4, 188, 100], a towel '
                                           '[1, 2, 30, 40]',
                        'subtask_reasoning': 'The arch must be reached first.',
                        'subtask': 'Reach for the arch.',
                        'move_reasoning': 'The arm is above it.', 'move': 'move down',
                        'gripper_position': '[97, 45, 97, 45, 89, 52]'}
    assert r.objects == (('wooden blocks', (150, 4, 188, 100)), ('a towel', (1, 2, 30, 40)))
    assert r.gripper == ((97, 45), (97, 45), (89, 52)) and r.num_tokens == 60


# ---- the engine: strict modes equal AR --------------------------------------------------------

@pytest.mark.parametrize('which, budget, num_streams', [('random', 40, 1), ('random', 24, 3),
                                                        ('scripted', 0, 1), ('scripted', 0, 4)])
def test_every_mode_gives_ars_tokens_text_and_action(folders, which, budget, num_streams):
    """Budget hit (random weights: refused frames of exactly the budget) and not hit (the
    scripted model: an action after its reasoning), consecutive and drifting frames, 1-4
    robots: every mode's tokens, reasoning text and action are AR's."""
    frames = drifting_frames(8 if num_streams == 1 else 12, num_streams)
    options = {'max_reasoning_tokens': budget} if budget else {}
    results = {}
    for mode in MODES:
        engine = policy(folders[which], mode=mode, **options).engine
        out = serve_streams(engine, [dataclasses.replace(f) for f in frames])
        results[mode] = [fin.result for fin in sorted(out, key=lambda f: f.request_id)]
    reference = results['ar']
    hit_budget = [not r.is_valid for r in reference]
    assert all(hit_budget) if which == 'random' else not any(hit_budget)
    for mode in MODES[1:]:
        for got, want in zip(results[mode], reference):
            assert got.tokens == want.tokens, mode
            assert got.reasoning.text == want.reasoning.text
            assert got.is_valid == want.is_valid and got.invalid_reason == want.invalid_reason
            np.testing.assert_array_equal(got.action, want.action)
    if which == 'random':
        assert reference[0].invalid_reason == f'no action within max_reasoning_tokens {budget}'
        assert len(reference[0].tokens) == budget + 1 + 1 + 7      # text, marker, "▁", bins
    else:
        assert reference[0].reasoning.fields['task'].startswith('put the cup')
        assert len(reference[0].tokens) < 256


def test_the_previous_output_decides_a_repeated_frame_in_a_few_forwards(folders):
    frames = [Frame(f.image, INSTRUCTION, UNNORM_KEY, 'cam') for f in drifting_frames(6, 1)]
    ar = policy(folders['scripted'], mode='ar').engine
    ar_out = serve_streams(ar, [dataclasses.replace(f) for f in frames])
    engine = policy(folders['scripted']).engine           # the default: pipeline_spec
    assert engine.config.mode == 'pipeline_spec'
    out = sorted(serve_streams(engine, frames), key=lambda f: f.request_id)
    assert [f.result.tokens for f in out] == [f.result.tokens for f in
                                              sorted(ar_out, key=lambda f: f.request_id)]
    ar_passes = [f.result.stats['forward_passes'] for f in ar_out]
    passes = [f.result.stats['forward_passes'] for f in out]
    assert min(ar_passes) == len(out[0].result.tokens)          # one forward per token
    # The second frame is admitted while the first decides (two frames of a robot in flight):
    # it drafts from the first's tokens as they come, one step behind. From the third on the
    # previous output is whole: its prefill verifies max_draft_chain tokens, one more forward
    # the rest (about 49 tokens in 2 forwards).
    assert max(passes[2:]) <= 3, passes


# ---- relaxation and the budget ----------------------------------------------------------------

def test_relaxation_never_touches_the_reasoning(folders):
    """Random weights write ids of the action range inside their text; with the marker rule
    a relaxed threshold accepts none of them inexactly: the tokens stay AR's."""
    frames = drifting_frames(6, 1)
    ar = policy(folders['random'], mode='ar', max_reasoning_tokens=32).engine
    reference = ar_reference_tokens_of(ar, frames)
    codec = ar.runner.codec
    assert any(codec.is_action_token(t) for tokens in reference for t in tokens)
    relaxed = policy(folders['random'], mode='pipeline_spec', max_reasoning_tokens=32,
                     relax_threshold=7).engine
    assert ar_reference_tokens_of(relaxed, frames) == reference


def test_relaxation_changes_only_the_action_after_the_marker(folders):
    frames = drifting_frames(6, 1)
    ar = policy(folders['scripted'], mode='ar').engine
    reference = ar_reference_tokens_of(ar, frames)
    relaxed = policy(folders['scripted'], mode='spec', relax_threshold=7).engine
    got = ar_reference_tokens_of(relaxed, frames)
    codec = ar.runner.codec
    for tokens, want in zip(got, reference):
        assert codec.split(tokens).reasoning == codec.split(want).reasoning
        assert len(tokens) == len(want)


def ar_reference_tokens_of(engine, frames):
    out = serve_streams(engine, [dataclasses.replace(f) for f in frames])
    return [f.result.tokens for f in sorted(out, key=lambda f: f.request_id)]


def test_the_budget_is_checked_and_refused_where_it_means_nothing(folders):
    from vla_spec_ros import VLAPolicy
    with pytest.raises(ValueError, match='max_reasoning_tokens'):
        VLAPolicy.from_pretrained('tiny', max_reasoning_tokens=64)      # OpenVLA: no reasoning
    with pytest.raises(ValueError, match='max_reasoning_tokens: a frame needs'):
        policy(folders['random'], max_reasoning_tokens=4096)
    p = policy(folders['random'], max_reasoning_tokens=16)
    assert p.engine.runner.codec.max_tokens == 16 + 1 + 1 + 7


def test_the_ar_reference_helper_agrees_with_predict(folders):
    p = policy(folders['scripted'], mode='ar')
    frames = drifting_frames(2, 1)
    assert ar_reference_tokens(p, frames) == [
        p.predict(f.image, f.instruction, f.unnorm_key).tokens for f in frames]


@pytest.mark.parametrize('which', ['random', 'scripted'])
def test_transformers_generate_gives_the_same_tokens(folders, which):
    """ECoT's baseline (transformers' Llama on the same prompt embeddings, greedy until the
    frame is complete) against the engine's AR, float64: the same tokens, budget hit or not."""
    pytest.importorskip('transformers')
    from vla_spec_ros.baseline import generate_tokens, make_baseline
    p = policy(folders[which], mode='ar', max_reasoning_tokens=40)
    baseline = make_baseline(p.engine.runner, p.config)
    for frame in drifting_frames(3, 1, seed=5):
        ours = p.predict(frame.image, frame.instruction, frame.unnorm_key).tokens
        assert tuple(generate_tokens(baseline, frame.image, frame.instruction)) == ours


def test_make_checkpoint_writes_the_scripted_test_aid(tmp_path, capsys):
    from vla_spec_ros.cli import main
    assert main(['make-checkpoint', '--preset', 'ecot-tiny', '--out', str(tmp_path / 'e'),
                 '--scripted-reasoning']) == 0
    raw = json.loads((tmp_path / 'e' / 'config.json').read_text())
    assert raw['vla_spec_scripted_reasoning'] is True
    result = policy(tmp_path / 'e').predict(drifting_frames(1, 1)[0].image, INSTRUCTION,
                                            UNNORM_KEY)
    assert result.is_valid and result.reasoning.fields['plan']
    # An OpenVLA preset takes no such option: exit code 2, the option named.
    assert main(['make-checkpoint', '--preset', 'tiny', '--out', str(tmp_path / 't'),
                 '--scripted-reasoning']) == 2
    assert 'scripted_reasoning' in capsys.readouterr().err


def test_the_ring_and_chains_are_sized_by_the_draft_chain_not_the_budget(folders):
    """A verified row is not free: a forward checks at most the codec's max_draft_chain
    drafts, so the ring's per-request scratch and a prefill's chain follow it, not the
    hundreds of tokens of the budget."""
    strategy = policy(folders['random']).engine.strategy
    codec = strategy.runner.codec
    assert codec.max_tokens == 256 + 1 + 1 + 7 and codec.max_draft_chain == 32
    assert strategy.max_prefill_draft == 32 and strategy.scratch == 33


def _parse_objects_reference(value):
    """The plain reference: a lazy name in front of each box (quadratic on a long field
    without a box, so only for short texts)."""
    import re
    box = re.compile(r'(.*?)\s*\[(-?\d+),\s*(-?\d+),\s*(-?\d+),\s*(-?\d+)\]')
    return tuple((m.group(1).strip(' ,'), tuple(int(m.group(i)) for i in range(2, 6)))
                 for m in box.finditer(value))


def test_visible_objects_parse_as_the_reference_on_random_texts_and_in_linear_time():
    """parse_objects against the plain lazy-regex reference on random texts of names, boxes,
    broken boxes, commas and spaces; and a long field with no box (a looping output) parsed
    at once: the reference took seconds, inside the engine's step, every robot waiting."""
    import time

    import numpy as np

    from vla_spec_ros.models.ecot.reasoning_text import parse_objects

    rng = np.random.default_rng(0)
    pieces = ['cup', 'a red block', ' ', '  ', ', ', '[1, 2, 3, 4]', '[10,20,-30,40]',
              '[1, 2, 3]', '[a, b, c, d]', '[', ']', 'x', '-5']
    for _ in range(500):
        text = ''.join(rng.choice(pieces) for _ in range(rng.integers(0, 12)))
        assert parse_objects(text) == _parse_objects_reference(text), text
    # 32 kB, no box: milliseconds now; the reference's quadratic scan takes about 20 s here
    # (a bound far from both, so that a 3x slower or faster machine does not matter).
    looping = ('a' + ' ' * 15) * 2048
    start = time.perf_counter()
    assert parse_objects(looping) == ()
    assert time.perf_counter() - start < 2.0
