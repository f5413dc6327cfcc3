"""The one integer / number validator every configuration uses (pure Python)."""
import numpy as np
import pytest

from vla_spec_ros.validation import check_int, check_number


@pytest.mark.parametrize('value', [0, 5, np.int64(3), np.int32(5)])
def test_check_int_accepts_python_and_numpy_integers_in_range(value):
    result = check_int('n', value, minimum=0, maximum=5)
    assert result == int(value) and type(result) is int


@pytest.mark.parametrize('value', [True, False, 3.0, 2.5, '3', None, -1, 6, float('nan')])
def test_check_int_refuses_non_integers_and_out_of_range_naming_the_field(value):
    with pytest.raises(ValueError, match=r'^n: must be an integer in \[0, 5\]'):
        check_int('n', value, minimum=0, maximum=5)


def test_check_int_open_ranges_and_unit_in_the_message():
    assert check_int('n', -10 ** 9) == -10 ** 9
    with pytest.raises(ValueError, match=r'^n: must be an integer >= 1 bins, got 0$'):
        check_int('n', 0, minimum=1, unit='bins')
    with pytest.raises(ValueError, match=r'<= 3'):
        check_int('n', 4, maximum=3)


@pytest.mark.parametrize('value', [float('inf'), float('nan'), True, '1.0', 11.0, -0.5])
def test_check_number_refuses_non_finite_bools_strings_and_out_of_range(value):
    with pytest.raises(ValueError, match=r'^x: must be a finite number in \[0.0, 10.0\] s'):
        check_number('x', value, minimum=0.0, maximum=10.0, unit='s')


def test_check_number_widens_integers_to_float():
    result = check_number('x', 2, minimum=0.0)
    assert result == 2.0 and type(result) is float


def test_check_number_above_is_strict():
    assert check_number('rate_hz', 0.5, above=0.0) == 0.5
    for value in (0.0, -1.0, float('inf')):
        with pytest.raises(ValueError, match=r'rate_hz: must be a finite number > 0.0'):
            check_number('rate_hz', value, above=0.0)
    with pytest.raises(ValueError, match=r'<= 2 and > 0.0'):
        check_number('gain', 3.0, maximum=2, above=0.0)


def test_check_number_without_a_range_reads_cleanly():
    """No range: no stray double space before the unit (it read "number  rad/s")."""
    with pytest.raises(ValueError, match=r'^x: must be a finite number \(rad/s\), got nan$'):
        check_number('x', float('nan'), unit='rad/s')
    with pytest.raises(ValueError, match=r'^x: must be a finite number, got inf$'):
        check_number('x', float('inf'))
