"""Reasoning only every N-th frame (``EngineConfig.reasoning_every_n``): Fast-ECoT's lossy
cache of a reasoning policy's text, as an option beside the exact default.

Per stream (robot): after a frame whose output held a complete action and was reasoned afresh,
the text before its action (the reasoning, the codec's marker and separator:
``codec.reasoning_prefix``) is kept. The next N - 1 frames of that stream start from it: their
output is forced to begin with those tokens (taken as decided, never verified:
engine/drafting/acceptance.py's ``forced``), so only the action is decoded after them, in the
new frame's context. The N-th frame reasons afresh and renews the kept text. N = 1 (the
default) keeps nothing and forces nothing: every token is greedy decoding's.

What it saves depends on the mode: the speculative modes verify the forced text as one chain
per forward (its drafts are the previous output), AR still spends a forward per token. Plain
Python; the engine owns one and calls it when a frame starts, at finish and at reset.
"""
from __future__ import annotations


class ReasoningReuse:
    def __init__(self):
        # stream -> (the frame context it was reasoned under, its reasoning prefix)
        self._kept: dict[str, tuple[tuple, tuple[int, ...]]] = {}
        self._since: dict[str, int] = {}                # stream -> frames since it was kept

    def forced_for(self, stream_id: str, every_n: int, context: tuple = ()) -> tuple[int, ...]:
        """The tokens a frame of ``stream_id`` about to start must begin with (empty: reason
        afresh). Counted when the frame starts (its prefill), not when it is submitted: a
        submitted frame replaced by a newer one before it started neither reuses nor counts,
        so a camera faster than the engine cannot stretch the reuse past N - 1 frames. After
        a fresh frame the next N - 1 frames that start reuse the kept text (the newest fresh
        reasoning with an action finished so far), then one reasons afresh. The kept text is
        reused only under the ``context`` it was reasoned in (the node: the instruction and
        the dataset statistics): a frame of a new instruction reasons afresh. N = 1 forgets
        the kept text, so turning reuse on again starts from a fresh reasoning."""
        if every_n <= 1:
            self.forget(stream_id)
            return ()
        kept, since = self._kept.get(stream_id), self._since.get(stream_id)
        if kept is None or kept[0] != context or since is None or since >= every_n - 1:
            self._since[stream_id] = 0
            return ()
        self._since[stream_id] = since + 1
        return kept[1]

    def observe(self, stream_id: str, prefix: tuple[int, ...] | None, was_forced: bool,
                context: tuple = ()) -> None:
        """A finished frame: a fresh reasoning with an action (``prefix`` not None) is kept
        with its ``context``; a fresh frame without one leaves nothing to reuse (the next
        reasons afresh)."""
        if was_forced:
            return
        if prefix is None:
            self._kept.pop(stream_id, None)
        else:
            self._kept[stream_id] = (tuple(context), tuple(prefix))

    def forget(self, stream_id: str | None = None) -> None:
        if stream_id is None:
            self._kept.clear()
            self._since.clear()
        else:
            self._kept.pop(stream_id, None)
            self._since.pop(stream_id, None)


__all__ = ['ReasoningReuse']
