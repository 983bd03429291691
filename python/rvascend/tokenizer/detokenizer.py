"""Incremental detokenization: each step decodes a few tokens, not the whole output.

Decoding is done over a short window (the last tokens already turned into
text plus the new ones), the way vLLM and TGI do it, so that tokenizers which
depend on the previous token (SentencePiece's leading space, byte-level BPE's
multi-byte characters) give the same text as decoding everything at once,
while the cost per step stays constant in the output length.
"""

from __future__ import annotations

from typing import Protocol, Sequence

# Prompt tokens the window starts with, so the first output token decodes
# in context (e.g. keeps its leading space).
_PROMPT_CONTEXT = 5
# A UTF-8 character spans at most 4 bytes, so at most 4 tokens: while more are
# held back and the text still ends in U+FFFD, the first held token cannot be
# part of a character still to be completed, and it is given out as it decodes
# (U+FFFD for its invalid bytes, as decoding everything at once gives). Without
# the cap a client could force an ever-longer window (a lone continuation byte
# sampled every step: 8k tokens cost 19 s) on the engine thread.
_MAX_HELD_TOKENS = 4


class _Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: _Decoder, prompt_ids: Sequence[int], skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_PROMPT_CONTEXT:])
        self._prefix = 0                 # window start
        self._read = len(self._ids)      # tokens before this are already text

    def add(self, token: int) -> str:
        """The text that `token` completes (empty while a character is still partial)."""
        self._ids.append(token)
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        if len(text) > len(prefix_text) and not text.endswith("\ufffd"):
            return self._advance(text[len(prefix_text):], len(self._ids))
        if len(self._ids) - self._read <= _MAX_HELD_TOKENS:
            return ""  # a partial UTF-8 character, or a token with no text
        first = self._decode(self._ids[self._prefix:self._read + 1])
        return self._advance(first[len(prefix_text):], self._read + 1)

    def _advance(self, delta: str, read: int) -> str:
        """Marks the tokens before `read` as text; keeps the window short by dropping
        what can no longer affect new text."""
        self._prefix, self._read = self._read, read
        if self._prefix > 64:
            del self._ids[:self._prefix]
            self._read -= self._prefix
            self._prefix = 0
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip)

    def flush(self) -> str:
        """At the end of the output: whatever is left, a partial character included."""
        prefix_text = self._decode(self._ids[self._prefix:self._read])
        text = self._decode(self._ids[self._prefix:])
        self._prefix = self._read = len(self._ids)
        return text[len(prefix_text):] if len(text) > len(prefix_text) else ""
