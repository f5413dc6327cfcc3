"""ECoT's prompt (Prismatic's Vicuna v1.5 chat format) and its tokens around the action.

The prompt of the released ECoT policies (``Embodied-CoT/ecot-openvla-7b-bridge``, Prismatic's
``siglip-224px+7b`` recipe on Vicuna v1.5) is the Vicuna system prompt, then
``USER: What action should the robot take to {instruction.lower()}? ASSISTANT: TASK:``: one
line, BOS first, no EOS, nothing after ``TASK:`` (the reasoning starts the answer; OpenVLA's
trailing "▁" token is not appended: ECoT's ``predict_action`` dropped it). The policy then
writes its reasoning, `` ACTION:``, a "▁" token and the 7 action tokens, then EOS.

``EcotPrompt`` wraps the checkpoint's tokenizer (``tokenizer.json``, read through
``tokenizers`` as OpenVLA's is): ``encode`` for the prompt, ``marker_ids`` for the tokens of
``ACTION:`` as the policy writes them, ``decode`` for the generated text.
"""
from __future__ import annotations

from ...instruction import PromptError, checked_instruction
from ..openvla.prompt import SPACE_PIECE, PromptTokenizer
from .reasoning_text import ACTION_TAG

SYSTEM_PROMPT = ('A chat between a curious user and an artificial intelligence assistant. '
                 "The assistant gives helpful, detailed, and polite answers to the user's "
                 'questions.')
PROMPT_TEMPLATE = (SYSTEM_PROMPT
                   + ' USER: What action should the robot take to {}? ASSISTANT: TASK:')


def format_prompt(instruction: str) -> str:
    return PROMPT_TEMPLATE.format(instruction.lower())


class EcotPrompt:
    """The prompt builder of an ECoT checkpoint (``models/protocol.PromptBuilder``)."""

    def __init__(self, tokenizer: PromptTokenizer):
        self.base = tokenizer
        self.tokenizer = tokenizer.tokenizer
        self.bos_id, self.space_id = tokenizer.bos_id, tokenizer.space_id
        self.eos_id = self.tokenizer.token_to_id('</s>')
        self.max_instruction_tokens = tokenizer.max_instruction_tokens
        self.prompt_overhead = len(self._encode_raw(format_prompt('')))

    @classmethod
    def from_folder(cls, folder, max_instruction_tokens: int = 128) -> 'EcotPrompt':
        return cls(PromptTokenizer.from_folder(folder, max_instruction_tokens))

    def _encode_raw(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=True).ids
        return ids if ids and ids[0] == self.bos_id else [self.bos_id] + ids

    def max_prompt_len(self, max_instruction_tokens: int) -> int:
        return self.prompt_overhead + max_instruction_tokens + 8

    def encode(self, instruction: str, state=None) -> list[int]:
        """Instruction -> prompt ids (BOS first, ending with ``TASK:``'s tokens)."""
        if state is not None:
            raise PromptError("state: this model's prompt reads no robot state")
        text = checked_instruction(instruction)
        ids = self._encode_raw(format_prompt(text))
        num_instruction_tokens = len(ids) - self.prompt_overhead
        if num_instruction_tokens > self.max_instruction_tokens:
            raise PromptError(f'instruction has {num_instruction_tokens} tokens; the limit '
                              f'(max_instruction_tokens) is {self.max_instruction_tokens}')
        return ids

    def marker_ids(self) -> tuple[int, ...]:
        """``ACTION:`` as the policy writes it after a space (Llama: ▁A CTION :)."""
        ids = self.tokenizer.encode(ACTION_TAG, add_special_tokens=False).ids
        if not ids:
            raise ValueError('tokenizer: "ACTION:" encodes to no tokens')
        return tuple(ids)

    def decode(self, ids) -> str:
        """Generated ids -> text (special tokens dropped; "▁" as a space)."""
        return self.tokenizer.decode([int(t) for t in ids], skip_special_tokens=True)


__all__ = ['EcotPrompt', 'PROMPT_TEMPLATE', 'SPACE_PIECE', 'SYSTEM_PROMPT', 'format_prompt']
