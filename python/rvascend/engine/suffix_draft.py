"""Drafts shared across requests (`--speculative-algorithm SUFFIX`, after vLLM's suffix
decoding): the tokens of recent requests (prompt and output) of the same API key, and
where each of their n-grams last occurred. A sequence drafts what followed its last n
tokens in another request where that match is longer than any in its own text (the
NGRAM draft, ngram_draft.py, which wins ties): an agent resending a tool's output, a file
another request wrote out, the same answer asked for again.

Drafts are proposals: the verify step keeps only what the target samples, so no
request's text reaches another's output, and a key's requests draft only from that
key's text. The corpus is bounded in tokens (`max_tokens`, oldest requests out first, whoever
sent them); its index holds one entry per n-gram size (three) per token, keyed by the
n-gram's hash (a collision is checked against the tokens and is a miss), so memory is
linear in the bound (about 0.5 KB a token). Adding a request is linear in its tokens and
runs after the step's commit, outside the scheduler's lock; proposing does not depend on
the corpus's size.

"The same API key" is as fine as the server tells keys apart: with one --api-key every
client is one owner; without one, the owner is whatever key a client sends (none: all
such clients are one owner). Outputs never depend on it; a draft's acceptance only
shows in speed.
"""

from __future__ import annotations

import collections
import itertools
from typing import Optional, Sequence


class SuffixCorpus:
    def __init__(self, max_tokens: int, min_window: int, max_window: int) -> None:
        if max_tokens < 1:
            raise ValueError(f"the suffix corpus must hold at least one token, not {max_tokens}")
        self.max_tokens = max_tokens
        # Three n-gram sizes, not every one between (NGRAM's own-text index has them all):
        # indexing costs a hash per size per token, and a cross-request match is long or none.
        self.windows = sorted({max_window, (min_window + max_window) // 2, min_window}, reverse=True)
        self.docs: collections.OrderedDict[int, tuple[Optional[str], list[int]]] = collections.OrderedDict()
        self.index: dict[int, tuple[int, int]] = {}  # hash of (owner, n-gram) -> (doc, where its continuation starts)
        self.size = 0  # tokens held
        self._ids = itertools.count()

    def _keys(self, owner: Optional[str], tokens: list[int]):
        """(key, continuation start) of every n-gram of `tokens` that something follows."""
        for p in range(1, len(tokens)):
            for n in self.windows:
                if p >= n:
                    yield hash((owner, tuple(tokens[p - n:p]))), p

    def add(self, owner: Optional[str], tokens: Sequence[int]) -> None:
        """A finished request's tokens (prompt and output), the newest text of `owner`."""
        tokens = list(tokens[-self.max_tokens:])
        if len(tokens) < 2:
            return
        doc = next(self._ids)
        self.docs[doc] = (owner, tokens)
        self.size += len(tokens)
        for key, p in self._keys(owner, tokens):
            self.index[key] = (doc, p)
        while self.size > self.max_tokens:
            old, (old_owner, old_tokens) = self.docs.popitem(last=False)
            self.size -= len(old_tokens)
            for key, _ in self._keys(old_owner, old_tokens):
                if self.index.get(key, (None,))[0] == old:
                    del self.index[key]

    def match(self, owner: Optional[str], tail: Sequence[int], k: int) -> tuple[int, list[int]]:
        """(n, up to k tokens that followed the last n tokens of `tail` in `owner`'s most
        recent request holding them), for the largest n that occurred; (0, []) if none did."""
        for n in self.windows:
            if len(tail) < n:
                continue
            gram = tuple(tail[len(tail) - n:])
            hit = self.index.get(hash((owner, gram)))
            if hit is None:
                continue
            doc_owner, tokens = self.docs[hit[0]]
            p = hit[1]
            if doc_owner == owner and tuple(tokens[p - n:p]) == gram and p < len(tokens):
                return n, tokens[p:p + k]
        return 0, []
