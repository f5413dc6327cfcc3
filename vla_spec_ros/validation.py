"""The package's one set of value checks: integers and finite numbers within a range.

Every configuration dataclass, the ROS parameter table and the engine's entry points use these,
so a bad value is reported the same way everywhere: a ValueError that starts with the field's
name. Pure Python (no numpy, no torch).
"""
from __future__ import annotations

import argparse
import math
import numbers


def _range_text(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f'in [{minimum}, {maximum}]'
    if minimum is not None:
        return f'>= {minimum}'
    if maximum is not None:
        return f'<= {maximum}'
    return ''


def check_int(name: str, value, *, minimum: int | None = None, maximum: int | None = None,
              unit: str = '') -> int:
    """`value` as an int; ValueError naming `name` unless it is an integer (Python or numpy;
    bools and floats refused, even 3.0: a float where a count belongs is a caller's bug)
    within [minimum, maximum]."""
    is_integral = not isinstance(value, bool) and isinstance(value, numbers.Integral)
    in_range = is_integral and ((minimum is None or value >= minimum)
                                and (maximum is None or value <= maximum))
    if not in_range:
        bounds = _range_text(minimum, maximum)
        suffix = f' {unit}' if unit else ''
        raise ValueError(f'{name}: must be an integer {bounds}{suffix}, got {value!r}')
    return int(value)


def check_number(name: str, value, *, minimum: float | None = None,
                 maximum: float | None = None, above: float | None = None,
                 unit: str = '') -> float:
    """`value` as a float; ValueError naming `name` unless it is a finite real number (bools
    refused) within [minimum, maximum] and, when `above` is given, strictly greater than it
    (a rate, a period, a scale that must be inverted)."""
    is_number = (not isinstance(value, bool) and isinstance(value, numbers.Real)
                 and math.isfinite(value))
    if not is_number or (minimum is not None and value < minimum) or (
            maximum is not None and value > maximum) or (above is not None and value <= above):
        bounds = ' and '.join(filter(None, [_range_text(minimum, maximum),
                                            f'> {above}' if above is not None else '']))
        if bounds:
            wanted = f' {bounds} {unit}' if unit else f' {bounds}'
        else:
            wanted = f' ({unit})' if unit else ''
        raise ValueError(f'{name}: must be a finite number{wanted}, got {value!r}')
    return float(value)


def require_int_fields(obj, names, minimum: int) -> None:
    """check_int on each named attribute of a dataclass instance (its __post_init__)."""
    for name in names:
        check_int(name, getattr(obj, name), minimum=minimum)


# ---- command-line arguments (argparse types) ----------------------------------------------

def at_least(minimum: int):
    """An argparse type: an integer >= `minimum` (a count of frames, streams, repeats), so a
    0 or a negative one is refused with the option's name instead of failing later."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f'expected an integer, got {text!r}') from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f'expected an integer >= {minimum}, got {value}')
        return value
    parse.__name__ = f'integer >= {minimum}'
    return parse


def positive_float(text: str) -> float:
    """An argparse type: a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a number, got {text!r}') from None
    if not value > 0 or value == float('inf'):
        raise argparse.ArgumentTypeError(f'expected a number > 0, got {text}')
    return value


__all__ = ['at_least', 'positive_float', 'check_int', 'check_number', 'require_int_fields']
