"""pi0-FAST's two conventions ("styles"), a checkpoint-level setting (docs/pi0fast.md, Prompt
styles). The weights are the same; what differs is how a frame becomes a prompt and where a
generated frame ends:

| | ``lerobot`` (LeRobot 0.6's ``pi0_fast``) | ``openpi`` (openpi's ``FASTTokenizer``) |
|---|---|---|
| instruction | case kept | lower-cased |
| state bins | ``state_dim`` of them | zero-padded to ``max_state_dim`` |
| after the prompt | a second ``<bos>`` | nothing |
| frame end | ``|`` (EOS is an ordinary token) | ``|`` then EOS (the frame ends at EOS) |
| resized image | float, bilinear, clamped to [0, 1] | rounded to uint8 |

A checkpoint's style is ``vla_spec_pi0fast.json``'s ``style`` (checkpoint.py); a folder without
that file is LeRobot's own and reads as ``lerobot``.
"""
from __future__ import annotations

LEROBOT = 'lerobot'
OPENPI = 'openpi'
STYLES = (LEROBOT, OPENPI)
DEFAULT_STYLE = LEROBOT


def check_style(style) -> str:
    if style not in STYLES:
        raise ValueError(f'style: {style!r} is not one of {STYLES}')
    return style
