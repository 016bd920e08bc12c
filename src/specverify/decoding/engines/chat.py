"""Text in and out: the chat template on the way in, detokenisation (whole or piece by piece) on the way out."""

from __future__ import annotations

from collections.abc import Sequence


class ChatTokenizer:
    """Wraps a transformers tokenizer that has a chat template."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_chat(self, text: str) -> list[int]:
        """One user message, with the template's prompt for the assistant's answer -> token ids."""
        if not text.strip():
            raise ValueError("prompt must not be empty")
        messages = [{"role": "user", "content": text}]
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        return [int(i) for i in ids]

    @property
    def stop_tokens(self) -> set[int]:
        """Ids that end an answer: the end-of-sequence token(s)."""
        eos = self.tokenizer.eos_token_id
        return set(eos) if isinstance(eos, list) else {eos} if eos is not None else set()

    def decode(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)

    def token_id(self, token: str) -> int:
        """The id of one token given as its id ("151667") or its text ("<think>")."""
        if token.isdigit():
            if int(token) >= len(self.tokenizer):
                raise ValueError(f"token id {token} is past the tokenizer's {len(self.tokenizer)} tokens")
            return int(token)
        ids = self.tokenizer.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"{token!r} is not one token of the tokenizer (it is {len(ids)}: {ids[:8]})")
        return ids[0]


class TextStream:
    """Detokenises a growing token list piece by piece: each call returns only the new text.

    Decoding the whole list each time keeps multi-token characters and word-boundary spaces right.
    """

    def __init__(self, tokenizer: ChatTokenizer):
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._text = ""

    def push(self, tokens: Sequence[int]) -> str:
        self._tokens += tokens
        text = self._tokenizer.decode(self._tokens)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next token
            return ""
        piece, self._text = text[len(self._text) :], text
        return piece
