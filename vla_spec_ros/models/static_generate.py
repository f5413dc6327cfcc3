"""The compiled variant of a family's transformers baseline, shared by every family.

What transformers' own performance guide prescribes for fast decoding: a ``StaticCache`` of
fixed length (allocated once, reset before every frame: one shape for every prompt, so one
compilation) and ``torch.compile`` of the decode forward, which ``generate`` applies itself
when the cache is static (``CompileConfig``: inductor, "reduce-overhead", i.e. CUDA graphs).
``generate`` compiles only on accelerators unless the compile config says otherwise;
``compile_backend`` lets CPU tests run the same path through a cheap backend.
"""
from __future__ import annotations


class StaticGenerate:
    """``generate`` keyword arguments for a static cache of ``max_cache_len`` positions on
    ``model`` (a transformers model) and its compiled decode. Call ``reset()`` before each
    frame's ``generate(**kwargs)``."""

    def __init__(self, model, max_cache_len: int, compile_backend: str = 'inductor'):
        from transformers import StaticCache
        from transformers.generation.configuration_utils import CompileConfig

        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        compile_config = CompileConfig(fullgraph=True, mode='reduce-overhead',
                                       backend=compile_backend)
        # generate() compiles only on accelerators unless told to compile everywhere
        # (transformers' own switch for this; CPU tests use a cheap backend).
        compile_config._compile_all_devices = True
        self.kwargs = {'past_key_values': self.cache, 'compile_config': compile_config}

    def reset(self) -> None:
        """The one static cache, emptied for the next frame."""
        self.cache.reset()


__all__ = ['StaticGenerate']
