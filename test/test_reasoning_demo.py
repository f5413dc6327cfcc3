"""The embedded reasoning model's data: the camera projection, the experts' phases, the
reasoning text written from the expert's state, and ECoT's demo-training recipe end to end
(collect -> train a few steps -> load through the registry -> decode a frame)."""
import json

import numpy as np
import pytest

from vla_spec_ros.models import registry
from vla_spec_ros.models.ecot.demo_reasoning import direction_words, reasoning_text
from vla_spec_ros.models.ecot.reasoning_text import parse_reasoning
from vla_spec_ros.sim.camera_projection import camera_matrix, project
from vla_spec_ros.sim.expert_facts import expert_facts, object_box
from vla_spec_ros.sim.expert_phases import PHASES, phase_index, phase_target
from vla_spec_ros.sim.metaworld_env import make_env, sim_unavailable_reason

SIM_REASON = sim_unavailable_reason()
needs_sim = pytest.mark.skipif(SIM_REASON is not None, reason=f'simulator: {SIM_REASON}')


def test_projection_of_points_on_and_off_the_camera_axis():
    # A camera at (0, 0, 1) looking down (-z of the camera = -z of the world), x right, y up.
    matrix = camera_matrix((0, 0, 1), np.eye(3), 90.0, 64, is_upside_down=False)
    np.testing.assert_allclose(project(matrix, [0, 0, 0]), [32, 32])
    # fovy 90: a point at depth 1 and height 1 lies on the image's top edge (v = 0).
    np.testing.assert_allclose(project(matrix, [0, 1, 0]), [32, 0], atol=1e-12)
    np.testing.assert_allclose(project(matrix, [1, 0, 0]), [64, 32], atol=1e-12)
    turned = camera_matrix((0, 0, 1), np.eye(3), 90.0, 64, is_upside_down=True)
    point = [0.5, 0.25, 0]
    np.testing.assert_allclose(project(turned, point), 64 - project(matrix, point))


@needs_sim
@pytest.mark.parametrize('task', sorted(PHASES))
def test_each_phase_aims_where_the_expert_moves(task):
    """The phase's target, seen from the hand, points where the expert's own action goes on
    every axis the expert moves along; each phase of the task occurs."""
    seen = set()
    with make_env(task, image_size=16) as env:
        for episode in range(3):
            env.reset(episode)
            for _ in range(150):
                state, action = env.state, env.expert_action()
                seen.add(phase_index(task, state))
                toward = phase_target(task, state) - state[:3]
                moving = np.abs(action[:3]) > 1e-3
                assert np.array_equal(np.sign(toward[moving]), np.sign(action[:3][moving]))
                _, _, done, _ = env.step(action)
                if done:
                    break
    assert seen == set(range(len(PHASES[task].phases)))


@needs_sim
def test_the_hand_and_the_object_project_into_the_image():
    with make_env('button-press-topdown', image_size=64) as env:
        env.reset(3)
        matrix = env.camera_matrix()
        u, v = project(matrix, env.state[:3])
        assert 0 <= u < 64 and 0 <= v < 64
        x1, y1, x2, y2 = object_box('button-press-topdown', env.state, matrix, 64)
        assert 0 <= x1 < x2 < 64 and 0 <= y1 < y2 < 64


def test_direction_words():
    assert direction_words([0.01, -0.004, 0.0], 0.0025) == 'right backward'
    assert direction_words([0.0, 0.001, -0.003], 0.0025) == 'down'
    assert direction_words([0.001, 0.001, 0.001], 0.0025) == 'stay'


def test_reasoning_text_parses_back_into_its_fields():
    matrix = camera_matrix((0, 0, 1), np.eye(3), 90.0, 64, is_upside_down=False)
    state = np.zeros(39)
    state[:3] = (0.1, 0.2, 0.3)
    state[4:7] = (0.1, 0.3, 0.05)
    facts = expert_facts('button-press-topdown', state, np.array([0.0, 0.01, 0.0, 0, 0, 0, 1]),
                         matrix, 64)
    text = reasoning_text('Press the Button', facts)
    reasoning = parse_reasoning(text)
    fields = reasoning.fields
    assert fields['task'] == 'press the button.'
    assert fields['plan'] == 'move above the button, press the button down.'
    assert fields['subtask'] == 'move above the button.'
    assert fields['move'] == 'forward.'
    assert reasoning.objects[0][0] == 'button'
    u, v = project(matrix, state[:3])
    assert reasoning.gripper == ((int(u), int(v)),)


@needs_sim
def test_ecot_demo_recipe_trains_and_loads_as_an_ecot_checkpoint(tmp_path):
    from vla_spec_ros.sim.demos import collect_demos, load_demos
    from vla_spec_ros.train import train_demo_vla as tdv
    data = tmp_path / 'demos'
    collect_demos(str(data), ['handle-press', 'button-press-topdown'], 2, 64, seed=3,
                  progress=False)
    demos = load_demos(str(data))
    assert demos.states.shape == (len(demos.actions), 39)
    assert demos.camera_matrix.shape == (3, 4)
    out = tmp_path / 'reason'
    from vla_spec_ros.cli import build_parser
    argv = ['train-demo-vla', '--family', 'ecot', '--data', str(data), '--out', str(out),
            '--steps', '3', '--batch-size', '4', '--log-every', '1', '--warmup-steps', '1',
            '--val-every-nth-episode', '2', '--threads', '1', '--seed', '1']
    args = build_parser().parse_args(argv)
    args.argv = argv
    assert tdv.run(args) == 0
    report = json.loads((out / 'training.json').read_text())
    assert report['vla']['preset'] == 'metaworld-demo-reason'
    assert 'val_reasoning_exact' in report['vla']['final']
    assert 30 < report['vla']['reasoning_tokens']['mean'] < 150
    assert registry.family_of_folder(out).name == 'ecot'
    from vla_spec_ros import VLAPolicy
    policy = VLAPolicy.from_pretrained(str(out), mode='ar')
    prompt = policy.engine.runner.model.prompt
    codec = policy.engine.runner.codec
    # The answers the model was trained on end with the marker, "▁" and 7 action ids.
    from vla_spec_ros.models.ecot.demo_training import answer_ids, demo_texts
    texts = demo_texts(demos)
    ids = answer_ids(prompt, texts[:1], np.full((1, 7), codec.inner.first_action_id))[0]
    marker = prompt.marker_ids()
    assert tuple(ids[-8 - len(marker):-8]) == marker and ids[-8] == prompt.space_id
    assert prompt.decode(ids[:-8]).strip() == f'{texts[0]} ACTION:'
    result = policy.predict(demos.images[0], str(demos.instructions[0]))
    assert 0 < len(result.tokens) <= codec.max_tokens


def test_the_recipe_refuses_demonstrations_without_states():
    from vla_spec_ros.models.ecot.demo_training import demo_texts
    from vla_spec_ros.sim.demos import DemoSet
    old = DemoSet(np.zeros((1, 64, 64, 3), np.uint8), np.zeros((1, 7), np.float32),
                  np.array(['open the drawer']), np.zeros(1, np.int32), np.zeros(1, np.int32),
                  ('drawer-open',), {})
    with pytest.raises(ValueError, match='collect them again'):
        demo_texts(old)


def test_init_from_is_refused_by_a_recipe_that_cannot_read_it(tmp_path):
    from vla_spec_ros.train.demo_training import train_model
    from vla_spec_ros.train.train_demo_vla import DemoTrainConfig

    class Demos:
        pass
    cfg = DemoTrainConfig(init_from=str(tmp_path))
    with pytest.raises(Exception):
        train_model(cfg, Demos(), tmp_path / 'out', tmp_path)
