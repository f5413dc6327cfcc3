"""Mode -> decoding strategy. "ar" runs inside ``Engine`` itself (the S1 reference); every
other mode is a ``PackedStrategy`` configured for pipelining and/or speculation."""
from __future__ import annotations

from ..config import EngineConfig
from .packed import PackedStrategy


def make_strategy(engine, config: EngineConfig) -> PackedStrategy:
    if config.mode not in ('pipeline', 'spec', 'pipeline_spec'):
        raise ValueError(f'mode: no packed strategy for {config.mode!r}')
    return PackedStrategy(engine, config)
