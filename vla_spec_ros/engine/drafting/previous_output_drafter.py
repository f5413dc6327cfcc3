"""Lookup drafting: a stream's previous output, re-anchored after each mismatch, is the draft.

A reasoning policy (ECoT) writes a few hundred tokens of plan and motion text before its action,
and most of a control step's text repeats the step before: the task and plan rarely change,
the subtask and the move often do not, a word here and a coordinate there do. The previous
action's chain (``PreviousActionDrafter``) drafts by *position*: once one token is inserted or
dropped, every later position is off by one and nothing more is accepted. This drafter drafts
by *context*, as prompt-lookup decoding does: for a request whose decided tokens end with
``t[-n:]``, it finds that n-gram in the stream's previous output and proposes what followed it
there. After a mismatch the verifier's bonus token (and the tokens before it) re-anchor the
chain at the place in the previous output where the text continues alike, so a changed
coordinate costs one forward, not the rest of the text.

The rule, for a request that has decided ``t`` (its root last), drafting from a source output
``s`` (the stream's other frames, newest first; a frame still in flight counts with what it
has decided so far):
  1. for n = ``anchor_len`` down to 1: the positions j with ``s[j - n:j] == t[-n:]``; if any,
     take the one nearest to ``len(t)`` (the same place in the text, when the text so far is
     as long as before; ties to the later j), and draft ``s[j], s[j + 1], ...``;
  2. a request that has decided nothing (the speculative prefill) drafts ``s`` from its start;
  3. no n-gram found in any source: no draft (the root alone, a plain decode step).
The chain is cut to ``max_chain`` tokens per verifier forward (a verified row is not free: the
family chooses it from measured cost) and to the request's remaining budget. The verifier
checks it like any draft: at ``relax_threshold`` 0 the tokens are exactly greedy decoding's,
whatever is proposed.

Selected with ``draft_path: previous_output``. Plain Python (no torch). Contract with the
speculative strategy as ``PreviousActionDrafter``'s (``update``, ``observe_action`` with every
decided output, ``forget_stream`` on a reset); the chain is certain by construction (scores
0), ``derives_depth``: the engine asks for every remaining token, ``max_nodes`` and
``max_chain`` bound it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ...validation import check_int
from .draft_tree import DraftTree, chain_tree
from .drafter import Drafter, check_path_from_root, check_proposal

PREVIOUS_OUTPUT_DRAFT = 'previous_output'   # the draft_path value that selects this drafter
DEFAULT_ANCHOR_LEN = 4      # longest n-gram matched first: long enough to skip repeated words
FRAMES_KEPT = 4             # a stream's newest frames kept to draft from


@dataclass
class _Output:
    request_id: int
    tokens: list = field(default_factory=list)


def anchored_chain(decided: Sequence[int], source: Sequence[int], anchor_len: int,
                   max_len: int) -> list[int]:
    """The draft after ``decided`` from ``source`` by the module's rule (steps 1-2), at most
    ``max_len`` tokens; [] when no n-gram of ``decided``'s end occurs in ``source``."""
    if max_len <= 0 or not source:
        return []
    if not decided:
        return list(source[:max_len])
    here = len(decided)
    for n in range(min(anchor_len, len(decided)), 0, -1):
        tail = list(decided[-n:])
        best = None
        for j in range(n, len(source)):          # s[j] must exist: something to draft
            if source[j - n:j] == tail and (best is None or abs(j - here) <= abs(best - here)):
                best = j
        if best is not None:
            return list(source[best:best + max_len])
    return []


class PreviousOutputDrafter(Drafter):
    """Each stream's previous output, re-anchored by its context; see the module docstring.

    ``max_tokens``: most tokens one frame decides (the codec's); ``max_chain``: most draft
    tokens per verifier forward (None: up to ``max_tokens``); ``anchor_len``: the longest
    n-gram matched.
    """

    def __init__(self, max_tokens: int, max_chain: int | None = None,
                 anchor_len: int = DEFAULT_ANCHOR_LEN):
        self.max_tokens = check_int('max_tokens', max_tokens, minimum=1)
        self.max_chain = self.max_tokens if max_chain is None else check_int(
            'max_chain', max_chain, minimum=1)
        self.anchor_len = check_int('anchor_len', anchor_len, minimum=1)
        self._own: dict[int, _Output] = {}              # request id -> its output so far
        self._stream_of: dict[int, str] = {}
        self._outputs: dict[str, dict[int, _Output]] = {}  # stream -> request id -> output

    # ---- the drafter interface ---------------------------------------------------------------

    def update(self, begins, advances, features) -> None:
        begins, advances = list(begins), list(advances)
        self.check_update(begins, advances)
        for begin in begins:
            output = self._output(str(begin.stream_id), begin.request_id)
            output.tokens = [int(t) for t in (*begin.decided_before_root, begin.root_token)]
            self._own[begin.request_id] = output
            self._stream_of[begin.request_id] = str(begin.stream_id)
        for adv in advances:
            output = self._own[adv.request_id]
            output.tokens += [*[int(t) for t in list(adv.path_tokens)[1:]], int(adv.bonus)]

    def check_update(self, begins, advances) -> None:
        for begin in begins:
            if begin.request_id in self._own:
                raise ValueError(f'request_id: {begin.request_id} already has a draft state; '
                                 'release it first')
            if not isinstance(begin.stream_id, str) or not begin.stream_id:
                raise ValueError(f'stream_id: lookup drafting needs the stream of request '
                                 f'{begin.request_id}, got {begin.stream_id!r}')
        for adv in advances:
            self._check_known(adv.request_id)
            check_path_from_root(adv, self._own[adv.request_id].tokens[-1])

    def propose_batch(self, request_ids, depths, top_k, max_nodes,
                      min_prob=0.0) -> list[DraftTree]:
        depths, max_nodes = check_proposal(request_ids, depths, top_k, max_nodes)
        trees = []
        for request_id, depth in zip(request_ids, depths):
            self._check_known(request_id)
            decided = self._own[request_id].tokens
            budget = min(depth, max_nodes - 1, self.max_chain,
                         self.max_tokens - len(decided))
            chain = self._chain(self._stream_of[request_id], request_id, decided, budget)
            trees.append(chain_tree(decided[-1], chain))    # the root: the last decided
        return trees

    @property
    def needs_features(self) -> bool:
        return False

    @property
    def has_prefill_draft(self) -> bool:
        return True

    def prefill_draft(self, stream_id: str, max_len: int, step: int | None = None) -> list[int]:
        """A new frame's chain: the stream's newest output from its start, up to ``max_len``
        and ``max_chain`` tokens."""
        max_len = min(check_int('max_len', max_len, minimum=0), self.max_chain)
        return self._chain(str(stream_id), None, [], max_len)

    @property
    def derives_depth(self) -> bool:
        return True

    def release(self, request_id) -> None:
        self._own.pop(request_id, None)
        self._stream_of.pop(request_id, None)

    def observe_action(self, stream_id: str, tokens: Sequence[int], request_id: int,
                       step: int | None = None) -> None:
        """A decided output (its whole text and action): the stream's newest source."""
        tokens = [int(t) for t in tokens]
        if not 1 <= len(tokens) <= self.max_tokens:
            raise ValueError(f'tokens: an output has 1 to {self.max_tokens} tokens, got '
                             f'{len(tokens)}')
        self._output(str(stream_id), int(request_id)).tokens = tokens

    def forget_stream(self, stream_id: str | None) -> None:
        if stream_id is None:
            self._outputs.clear()
        else:
            self._outputs.pop(str(stream_id), None)

    # ---- the rule -----------------------------------------------------------------------------

    def _chain(self, stream_id: str, request_id: int | None, decided, max_len: int) -> list:
        """The first source (newest first, the request's own output excluded) that gives a
        chain (module docstring, steps 1-3)."""
        outputs = self._outputs.get(stream_id, {})
        for rid in sorted(outputs, reverse=True):
            if rid == request_id:
                continue
            chain = anchored_chain(decided, outputs[rid].tokens, self.anchor_len, max_len)
            if chain:
                return chain
        return []

    def _output(self, stream_id: str, request_id: int) -> _Output:
        outputs = self._outputs.setdefault(stream_id, {})
        output = outputs.get(request_id)
        if output is None:
            output = outputs[request_id] = _Output(request_id)
            if len(outputs) > FRAMES_KEPT:
                del outputs[min(outputs)]
        return output

    def _check_known(self, request_id) -> None:
        if request_id not in self._own:
            raise ValueError(f'request_id: {request_id} has no draft state (begin() first)')


__all__ = ['PREVIOUS_OUTPUT_DRAFT', 'PreviousOutputDrafter', 'anchored_chain']
