"""The torch device a command-line option names, checked before anything is loaded.

"cpu", "cuda" or "cuda:N", with CUDA present and device N on this machine; anything else is a
ValueError naming the option. Left to torch, another string is a RuntimeError and CUDA on a
machine without it an AttributeError or a RuntimeError, raised after the model has loaded.
"""
from __future__ import annotations

import re

import torch

DEVICE_PATTERN = re.compile(r'cpu|cuda(:[0-9]+)?')


def parse_device(option: str, text: str) -> torch.device:
    """``text`` as a torch device; ValueError starting with ``option`` unless it is one this
    machine has."""
    if not isinstance(text, str) or not DEVICE_PATTERN.fullmatch(text):
        raise ValueError(f'{option}: {text!r}: expected "cpu" or "cuda[:N]"')
    device = torch.device(text)
    if device.type == 'cuda':
        if not torch.cuda.is_available():
            raise ValueError(f'{option}: {text!r} requested but CUDA is not available')
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f'{option}: {text!r}: this machine has {count} CUDA device'
                             f'{"s" if count != 1 else ""}')
    return device


__all__ = ['parse_device']
