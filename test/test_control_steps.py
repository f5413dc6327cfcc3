"""The control step of each image (ros/control_steps.py): counted from the robot's previous
image, so stamp jitter below half a period never moves a step, wherever in a period the camera's
images fall; dropped frames, a changed period and a clock that jumps back."""
import math

import numpy as np
import pytest

from vla_spec_ros.ros.control_steps import ControlSteps

PERIOD = 1 / 30


def _stamps(num: int, phase: float, jitter: float, seed: int = 0) -> np.ndarray:
    """Images every period at `phase` of a period past the clock's whole periods, each off by
    up to `jitter` periods."""
    rng = np.random.default_rng(seed)
    k = 1_000_000 + np.arange(num)
    return (k + phase + rng.uniform(-jitter, jitter, num)) * PERIOD


@pytest.mark.parametrize('phase', [0.0, 0.25, 0.5, 0.75, 0.99])
def test_consecutive_images_are_one_step_apart_at_any_phase(phase):
    steps = ControlSteps()
    counted = [steps.step_at(t, PERIOD) for t in _stamps(300, phase, jitter=0.2)]
    assert np.all(np.diff(counted) == 1)


def test_rounding_the_clock_instead_would_move_steps_near_half_a_period():
    """Why the count is relative: the same stamps, rounded from the clock's zero, put 0 and 2
    steps between consecutive images (the drafter would shift the previous chunk wrongly)."""
    stamps = _stamps(300, 0.5, jitter=0.2)
    absolute = np.diff([round(t / PERIOD) for t in stamps])
    assert set(absolute.tolist()) >= {0, 2}


def test_dropped_images_count_their_periods():
    steps = ControlSteps()
    first = steps.step_at(100.0, PERIOD)
    assert first == round(100.0 / PERIOD)
    assert steps.step_at(100.0 + 3.1 * PERIOD, PERIOD) == first + 3
    assert steps.step_at(100.0 + 3.7 * PERIOD, PERIOD) == first + 4   # 0.6 periods later: 1


def test_a_new_period_counts_from_the_clock_again():
    steps = ControlSteps()
    steps.step_at(10.0, PERIOD)
    assert steps.step_at(10.1, 0.05) == round(10.1 / 0.05)
    assert steps.step_at(10.15, 0.05) == round(10.1 / 0.05) + 1


def test_a_clock_that_jumps_back_counts_back():
    steps = ControlSteps()
    before = steps.step_at(50.0, PERIOD)
    assert steps.step_at(1.0, PERIOD) == before - round(49.0 / PERIOD)


def test_a_time_that_is_not_finite_does_not_poison_the_count():
    steps = ControlSteps()
    first = steps.step_at(2.0, PERIOD)
    assert steps.step_at(math.nan, PERIOD) == 0
    assert steps.step_at(2.0 + PERIOD, PERIOD) == first + 1


@pytest.mark.parametrize('period', [0.0, -1.0, math.inf, math.nan])
def test_a_bad_period_is_refused(period):
    with pytest.raises(ValueError, match='control_period'):
        ControlSteps().step_at(1.0, period)
