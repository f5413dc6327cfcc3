"""Tests of the Meta-World wrapper, the action mapping and demonstration collection.

The action mapping, norm_stats and seeding tests are pure numpy; the simulator tests are skipped
when metaworld/mujoco or off-screen rendering (libosmesa6) is unavailable.
"""

import json
import math
import os

import numpy as np
import pytest

from vla_spec_ros.sim.demos import (
    ACTION_MASK, action_norm_stats, choose_instruction, collect_demos, episode_seed,
    evaluate_scripted, load_demos)
from vla_spec_ros.sim.frames import benchmark_frames, episode_frames
from vla_spec_ros.sim.metaworld_env import (
    DEFAULT_TASK_NAMES, TASKS, get_task, make_env, sim_unavailable_reason, to_metaworld_action,
    to_vla_action)

SIM_REASON = sim_unavailable_reason()
needs_sim = pytest.mark.skipif(SIM_REASON is not None, reason=f"simulator: {SIM_REASON}")
# The quickest expert in TASKS (about 30-40 steps to success).
FAST_TASK = "handle-press"


# ------------------------------------------------------------------------- pure numpy


def test_to_vla_action_hand_computed():
    # 1 cm per unit of Meta-World action; effort -1 (open) -> gripper 1, +1 (close) -> 0.
    a7 = to_vla_action([1.0, -0.5, 0.0, -1.0])
    np.testing.assert_allclose(a7, [0.01, -0.005, 0.0, 0.0, 0.0, 0.0, 1.0], atol=1e-7)
    assert a7.dtype == np.float32
    a7 = to_vla_action([0.0, 0.0, 0.25, 1.0])
    np.testing.assert_allclose(a7, [0.0, 0.0, 0.0025, 0.0, 0.0, 0.0, 0.0], atol=1e-7)
    # Experts may exceed the box; the environment clips, so the recorded action is clipped.
    a7 = to_vla_action([3.0, -2.0, 0.0, 0.0])
    np.testing.assert_allclose(a7, [0.01, -0.01, 0.0, 0.0, 0.0, 0.0, 0.5], atol=1e-7)


def test_action_mapping_round_trips():
    rng = np.random.default_rng(0)
    for a4 in rng.uniform(-1.0, 1.0, size=(200, 4)):
        back = to_metaworld_action(to_vla_action(a4))
        np.testing.assert_allclose(back, a4, atol=1e-6)
    for a4 in ([1, 1, 1, 1], [-1, -1, -1, -1], [0, 0, 0, 0]):
        np.testing.assert_allclose(to_metaworld_action(to_vla_action(a4)), a4, atol=1e-6)


def test_to_metaworld_action_ignores_rotation_and_clips():
    a4 = to_metaworld_action([0.005, 0.0, -0.02, 0.3, -0.2, 0.1, 0.25])
    np.testing.assert_allclose(a4, [0.5, 0.0, -1.0, 0.5], atol=1e-6)
    assert a4.dtype == np.float32
    np.testing.assert_allclose(to_metaworld_action([0, 0, 0, 0, 0, 0, 2.0])[3], -1.0)


@pytest.mark.parametrize("bad", [[0.0] * 6, [0.0] * 8, [0.0] * 6 + [float("nan")]])
def test_to_metaworld_action_rejects_bad_input(bad):
    with pytest.raises(ValueError, match="action7"):
        to_metaworld_action(bad)


def test_to_vla_action_rejects_bad_shape():
    with pytest.raises(ValueError, match="action4"):
        to_vla_action([0.0, 0.0, 0.0])


def test_action_norm_stats_hand_computed():
    # Column d holds 0..100 scaled by (d + 1): q01 = 1 * (d + 1), q99 = 99 * (d + 1)
    # (linear interpolation at positions 1 and 99 of 101 sorted values).
    column = np.arange(101, dtype=np.float64)
    actions = np.stack([column * (d + 1) for d in range(7)], axis=1)
    entry = action_norm_stats(actions, num_trajectories=3)
    action = entry["action"]
    assert set(action) == {"mean", "std", "max", "min", "q01", "q99", "mask"}
    for d in range(7):
        scale = d + 1
        assert action["q01"][d] == pytest.approx(1.0 * scale)
        assert action["q99"][d] == pytest.approx(99.0 * scale)
        assert action["mean"][d] == pytest.approx(50.0 * scale)
        assert action["min"][d] == 0.0 and action["max"][d] == pytest.approx(100.0 * scale)
        # population std of 0..n-1 is sqrt((n^2 - 1) / 12)
        assert action["std"][d] == pytest.approx(math.sqrt((101 ** 2 - 1) / 12) * scale)
    assert action["mask"] == [True] * 6 + [False]
    assert entry["num_transitions"] == 101 and entry["num_trajectories"] == 3
    json.dumps(entry)  # plain JSON types only


def test_action_norm_stats_rejects_bad_shape():
    with pytest.raises(ValueError, match="actions"):
        action_norm_stats(np.zeros((5, 4)), 1)


def test_episode_seeds_are_stable_and_distinct():
    seeds = {episode_seed(7, task.name, ep) for task in TASKS for ep in range(20)}
    assert len(seeds) == len(TASKS) * 20
    assert episode_seed(7, "drawer-open", 3) == episode_seed(7, "drawer-open-v3", 3)
    assert episode_seed(7, "drawer-open", 3) != episode_seed(8, "drawer-open", 3)
    task = get_task("drawer-open")
    assert choose_instruction(task, 123) == choose_instruction(task, 123)
    assert {choose_instruction(task, s) for s in range(200)} == set(task.instructions)


def test_tasks_are_well_formed():
    assert len(TASKS) >= 5
    for task in TASKS:
        assert task.env_name == f"{task.name}-v3"
        assert 3 <= len(task.instructions) <= 4
        assert len(set(task.instructions)) == len(task.instructions)
    with pytest.raises(ValueError, match="task_name"):
        get_task("no-such-task")


# ------------------------------------------------------------------------- simulator


@needs_sim
def test_seeded_reset_is_deterministic():
    with make_env("drawer-open", seed=3, image_size=48) as env:
        first = env.reset()            # the first reset uses the construction seed
        again = env.reset(seed=3)
        other = env.reset(seed=4)
    assert first.shape == (48, 48, 3) and first.dtype == np.uint8
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)  # the drawer is placed from the seed


@needs_sim
def test_scripted_steps_give_images_and_finite_actions():
    with make_env(FAST_TASK, seed=0, image_size=40, max_steps=6) as env:
        image = env.reset(seed=11)
        images, is_done, num_steps = [image], False, 0
        while not is_done:
            action = env.expert_action()
            assert action.shape == (7,) and action.dtype == np.float32
            assert np.all(np.isfinite(action))
            assert np.all(action[3:6] == 0.0)            # no rotation in Meta-World
            assert np.all(np.abs(action[:3]) <= 0.01 + 1e-7)
            assert 0.0 <= action[6] <= 1.0
            image, is_success, is_done, info = env.step(action)
            images.append(image)
            num_steps += 1
            np.testing.assert_allclose(info["metaworld_action"], to_metaworld_action(action))
        with pytest.raises(ValueError, match="reset"):
            env.step(action)
    assert num_steps == 6 or is_success
    assert all(im.shape == (40, 40, 3) and im.dtype == np.uint8 for im in images)
    assert not np.array_equal(images[0], images[-1])  # the arm moved


@needs_sim
def test_collect_demos_writes_dataset(tmp_path):
    out = str(tmp_path / "demos")
    manifest = collect_demos(out, [FAST_TASK], episodes_per_task=1, image_size=32, seed=5,
                             max_steps=150, progress=False)
    entry = manifest["tasks"][FAST_TASK]
    assert entry["num_attempted"] == 1 and entry["num_kept"] == 1
    with np.load(os.path.join(out, entry["file"]), allow_pickle=False) as data:
        num_steps = len(data["actions"])
        assert data["images"].shape == (num_steps, 32, 32, 3)
        assert data["images"].dtype == np.uint8
        assert data["actions"].shape == (num_steps, 7) and data["actions"].dtype == np.float32
        assert np.all(np.isfinite(data["actions"]))
        assert data["instructions"].shape == (num_steps,)
        assert str(data["instructions"][0]) in get_task(FAST_TASK).instructions
        np.testing.assert_array_equal(data["step_index"], np.arange(num_steps))
        np.testing.assert_array_equal(data["episode_index"], np.zeros(num_steps))
        assert data["episode_lengths"].tolist() == [num_steps]
        assert data["episode_seeds"].tolist() == [episode_seed(5, FAST_TASK, 0)]
        actions = data["actions"].astype(np.float64)
    assert 0 < num_steps < 150  # kept episodes are successes, ended before the limit
    with open(os.path.join(out, "dataset_statistics.json")) as f:
        stats = json.load(f)
    (name,) = stats
    assert stats[name]["num_transitions"] == num_steps
    assert stats[name]["num_trajectories"] == 1
    action = stats[name]["action"]
    assert set(action) == {"mean", "std", "max", "min", "q01", "q99", "mask"}
    assert action["mask"] == list(ACTION_MASK)
    np.testing.assert_allclose(action["q01"], np.percentile(actions, 1, axis=0), atol=1e-9)
    np.testing.assert_allclose(action["q99"], np.percentile(actions, 99, axis=0), atol=1e-9)
    np.testing.assert_allclose(action["min"], actions.min(axis=0), atol=1e-9)
    with open(os.path.join(out, "manifest.json")) as f:
        assert json.load(f) == manifest
    assert manifest["versions"]["metaworld"] is not None
    demos = load_demos(out)
    assert demos.images.shape == (num_steps, 32, 32, 3)
    assert demos.task_names == (FAST_TASK,)


@needs_sim
def test_evaluate_scripted_succeeds_on_an_easy_task():
    rate = evaluate_scripted(FAST_TASK, episodes=2, seed=1, image_size=16)
    assert rate == 1.0


@needs_sim
@pytest.mark.parametrize("frames", ["every", "one_in_flight"])
def test_run_episode_applies_the_delayed_lockstep_schedule(frames):
    from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
    from vla_spec_ros.sim.demos import run_episode
    answers, applied = {}, []

    def policy(image, instruction):          # frame k's answer: x-delta from k, gripper 0.3
        k = len(answers)
        answers[k] = np.r_[0.001 * (k + 1), np.zeros(5), 0.3]
        return answers[k]
    delay = DelayedLockstep(3, "previous", frames)
    with make_env(FAST_TASK, seed=0, image_size=16, max_steps=10) as env:
        result, _, _ = run_episode(env, policy, 11, "press the handle", delay=delay,
                                   on_step=lambda t, a, fresh: applied.append((t, a, fresh)))
    assert result.num_steps == len(applied) == 10
    sent = list(range(10)) if frames == "every" else [0, 3, 6, 9]
    assert len(answers) == len(sent)          # only the wanted frames reached the policy
    for t, action, is_fresh in applied:
        if t < 3:                             # before the first answer lands: hold still, open
            assert not is_fresh and np.array_equal(action, np.r_[np.zeros(6), 1.0])
        elif t in [k + 3 for k in sent]:      # frame k's answer lands at k + 3
            assert is_fresh
            np.testing.assert_array_equal(action, answers[sent.index(t - 3)])
        else:                                 # one in flight: the previous answer holds
            assert not is_fresh and np.array_equal(action, applied[t - 1][1])


@needs_sim
def test_run_episode_ends_when_the_policy_gives_no_valid_action():
    from vla_spec_ros.sim.delayed_lockstep import DelayedLockstep
    from vla_spec_ros.sim.demos import run_episode
    calls = []

    def policy(image, instruction):
        calls.append(1)
        return None if len(calls) == 3 else np.r_[np.zeros(6), 1.0]
    with make_env(FAST_TASK, seed=0, image_size=16, max_steps=10) as env:
        result, _, _ = run_episode(env, policy, 11, "press the handle",
                                   delay=DelayedLockstep(0))
    assert not result.is_success and result.num_steps == 2 and len(calls) == 3


@needs_sim
def test_benchmark_frames_take_the_tasks_in_turn():
    """`vla-spec bench --frames-from metaworld`: the tasks in turn, streams round robin, the
    same frames for the same seed, successive frames of a task along the expert's path."""
    frames = benchmark_frames(9, 64, seed=1, unnorm_key='metaworld_scripted', num_streams=2)
    trained = [get_task(name) for name in DEFAULT_TASK_NAMES]
    first_phrasings = [task.instructions[0] for task in trained]
    assert [f.instruction for f in frames] == (first_phrasings + first_phrasings)[:9]
    assert [f.stream_id for f in frames] == [f'stream{i % 2}' for i in range(9)]
    assert {f.unnorm_key for f in frames} == {'metaworld_scripted'}
    assert all(f.image.shape == (64, 64, 3) and f.image.dtype == np.uint8 for f in frames)
    again = benchmark_frames(9, 64, seed=1, unnorm_key='metaworld_scripted', num_streams=2)
    assert all(np.array_equal(a.image, b.image) for a, b in zip(frames, again))
    assert not np.array_equal(frames[0].image, frames[len(trained)].image)


@needs_sim
def test_episode_frames_follow_each_task_step_by_step():
    """`--frames-from metaworld-episodes`: per stream, runs of ceil(num / streams / 6)
    consecutive control steps of one task, the tasks in turn; streams round robin, each with
    its own episodes; seeded.
    Consecutive steps of a run are the expert's path one step apart: each frame is closer to
    its successor than the frames of different runs are to each other."""
    phrasings = [get_task(name).instructions[0] for name in DEFAULT_TASK_NAMES]
    two = episode_frames(2, 32, seed=2, unnorm_key='metaworld_scripted', num_streams=2)
    assert [(f.stream_id, f.instruction) for f in two] == \
        [('stream0', phrasings[0]), ('stream1', phrasings[0])]
    stream = episode_frames(7, 32, seed=2, unnorm_key='metaworld_scripted')
    # 7 frames: runs of ceil(7 / 6) = 2 steps
    assert [f.instruction for f in stream] == \
        [phrasings[0]] * 2 + [phrasings[1]] * 2 + [phrasings[2]] * 2 + [phrasings[3]]
    assert {f.stream_id for f in stream} == {'stream0'}
    again = episode_frames(2, 32, seed=2, unnorm_key='metaworld_scripted', num_streams=2)
    assert all(np.array_equal(a.image, b.image) for a, b in zip(two, again))

    def distance(a, b):
        return np.abs(a.image.astype(int) - b.image.astype(int)).mean()
    within = max(distance(stream[i], stream[i + 1]) for i in (0, 2, 4))
    across = min(distance(stream[i], stream[j]) for i in (0, 2, 4) for j in (0, 2, 4) if i < j)
    assert within < across


def test_benchmark_frames_without_the_simulator_say_how_to_install_it(monkeypatch):
    from vla_spec_ros.sim import metaworld_env
    monkeypatch.setattr(metaworld_env, 'sim_unavailable_reason', lambda: 'no mujoco here')
    with pytest.raises(RuntimeError, match='install.sh sim.*no mujoco here'):
        benchmark_frames(3, 64, seed=1, unnorm_key=None)
    with pytest.raises(RuntimeError, match='install.sh sim.*no mujoco here'):
        episode_frames(3, 64, seed=1, unnorm_key=None)


@needs_sim
def test_dart_noise_moves_the_arm_but_labels_stay_the_experts(tmp_path):
    """``action_noise``: the visited states differ from the clean run's, and each recorded
    label is the expert's own action at its recorded state; two folders load as one set."""
    import warnings

    import metaworld

    from vla_spec_ros.sim.demos import load_demo_sets
    from vla_spec_ros.sim.metaworld_env import to_vla_action
    clean, noisy = str(tmp_path / "clean"), str(tmp_path / "noisy")
    collect_demos(clean, [FAST_TASK], 1, image_size=16, seed=5, progress=False)
    manifest = collect_demos(noisy, [FAST_TASK], 1, image_size=16, seed=5, progress=False,
                             action_noise=0.5)
    assert manifest["action_noise"] == 0.5
    a, b = load_demos(clean), load_demos(noisy)
    n = min(len(a.states), len(b.states))
    assert not np.allclose(a.states[1:n, :3], b.states[1:n, :3])     # the arm drifted
    expert = metaworld.policies.ENV_POLICY_MAP[get_task(FAST_TASK).env_name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for state, label in zip(b.states, b.actions):
            np.testing.assert_allclose(to_vla_action(expert.get_action(
                state.astype(np.float64))), label, atol=1e-4)
    both = load_demo_sets([clean, noisy])
    assert len(both.actions) == len(a.actions) + len(b.actions)
    assert sorted(np.unique(both.episode_index)) == [0, 1]
    (entry,) = both.norm_stats.values()
    assert entry["num_trajectories"] == 2
    np.testing.assert_allclose(entry["action"]["max"], np.concatenate(
        [a.actions, b.actions]).max(0), atol=1e-7)
    with pytest.raises(ValueError, match="action_noise"):
        collect_demos(clean, [FAST_TASK], 1, action_noise=2.0, progress=False)
