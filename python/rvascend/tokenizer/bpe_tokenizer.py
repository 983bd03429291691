"""A byte-level BPE tokenizer read from `tokenizer.json`, in pure Python.

For machines where the `tokenizers` library cannot be installed (no riscv64
wheel on PyPI, no Debian package): the riscv64 image and RISC-V boards. It
implements the subset of the format that byte-level BPE checkpoints use
(GPT-2, Llama 3, Qwen 2/3, this project's default model) and refuses anything
else by name:

- normalizer: none or NFC;
- pre-tokenizer: ByteLevel (with or without its regex), Split on a regex
  (behavior Isolated), or a Sequence of those;
- model: BPE with merges (`ignore_merges` honoured), no dropout, no byte fallback;
- added tokens matched before pre-tokenization, leftmost-longest, with their
  `single_word`, `lstrip`, `rstrip` and `normalized` flags as `tokenizers` applies them;
- post-processor: TemplateProcessing (single sequence), ByteLevel, or none;
- decoder: ByteLevel (every token, added ones included; a token with a character
  outside the byte alphabet decodes as its own UTF-8, as `tokenizers` does).

`tokenizers` stays the implementation wherever it is installed; tests check
that both give the same ids on a mixed corpus.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import unicodedata
from typing import Any, Optional

import regex

# The pattern of the ByteLevel pre-tokenizer's regex (GPT-2's word split).
_BYTE_LEVEL_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


# Words longer than this are tokenized without a cache entry: a prompt's one huge
# run of letters should not stay resident as a key.
_CACHED_WORD_CHARS = 256


class UnsupportedTokenizer(ValueError):
    """tokenizer.json uses a part of the format this reader does not implement."""


@functools.lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """Byte-level BPE's reversible byte -> printable character map: printable
    Latin-1 bytes stand for themselves, the others take code points from 256 up."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


@functools.lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}


def byte_level_bytes(piece: str) -> Optional[bytes]:
    """A byte-level BPE vocabulary entry's bytes (each character one byte of the
    alphabet above), or None when a character is outside the alphabet."""
    to_byte = _unicode_to_byte()
    mapped = [to_byte.get(c) for c in piece]
    return None if None in mapped else bytes(mapped)


def _merge(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Applies BPE merges to `word`'s characters, lowest rank first and leftmost
    first among equal ranks, in O(n log n): the symbols form a linked list and
    candidate pairs wait in a heap keyed by (rank, position). A popped pair whose
    symbols have changed since it was pushed is stale and skipped; a symbol only
    ever grows by absorbing its right neighbour, so comparing the two strings
    tells. (Rescanning the word after every merge, as the textbook loop does, is
    quadratic: 8k letters took 2.2 s.)"""
    symbols: list[str] = list(word)
    n = len(symbols)
    if n < 2:
        return symbols
    nxt = list(range(1, n + 1))   # n: no right neighbour
    prev = list(range(-1, n - 1))
    heap = []
    for i in range(n - 1):
        rank = ranks.get((symbols[i], symbols[i + 1]))
        if rank is not None:
            heap.append((rank, i, symbols[i], symbols[i + 1]))
    heapq.heapify(heap)
    while heap:
        rank, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        if j >= n or symbols[i] != left or symbols[j] != right:
            continue  # stale: i was absorbed (its string is ""), or a side grew since
        symbols[i] = left + right
        symbols[j] = ""
        nxt[i] = nxt[j]
        if nxt[j] < n:
            prev[nxt[j]] = i
        p, q = prev[i], nxt[i]
        if p >= 0:
            r = ranks.get((symbols[p], symbols[i]))
            if r is not None:
                heapq.heappush(heap, (r, p, symbols[p], symbols[i]))
        if q < n:
            r = ranks.get((symbols[i], symbols[q]))
            if r is not None:
                heapq.heappush(heap, (r, i, symbols[i], symbols[q]))
    return [s for s in symbols if s]


@dataclasses.dataclass
class Encoding:
    ids: list[int]


class _AddedTokenMatcher:
    """Finds added tokens in text: leftmost-longest, a `single_word` token only
    between non-word characters, `lstrip` / `rstrip` taking the whitespace beside it."""

    _WORD_CHAR = regex.compile(r"\w")

    def __init__(self, tokens: list[dict[str, Any]]) -> None:
        self.tokens = {t["content"]: t for t in tokens if t["content"]}
        contents = sorted(self.tokens, key=len, reverse=True)
        self.pattern = regex.compile("|".join(regex.escape(c) for c in contents)) if contents else None

    def split(self, text: str) -> list[tuple[str, Optional[int]]]:
        """(piece, added token id or None) covering `text` in order. Every check
        looks at the characters beside a match, never at the text before or after
        it, so the work stays linear in the text's length."""
        if self.pattern is None:
            return [(text, None)] if text else []
        out: list[tuple[str, Optional[int]]] = []
        done = 0
        word = self._WORD_CHAR.match
        for m in self.pattern.finditer(text):
            token = self.tokens[m.group()]
            start, stop = m.start(), m.end()
            if token.get("single_word") and ((start > 0 and word(text, start - 1))
                                             or (stop < len(text) and word(text, stop))):
                continue
            if start < done:  # an earlier token's rstrip took this match's start
                continue
            if token.get("lstrip"):
                while start > done and text[start - 1].isspace():
                    start -= 1
            if token.get("rstrip"):
                while stop < len(text) and text[stop].isspace():
                    stop += 1
            if done < start:
                out.append((text[done:start], None))
            out.append((text[start:stop], token["id"]))
            done = stop
        if done < len(text):
            out.append((text[done:], None))
        return out


class BpeTokenizer:
    """The methods of `tokenizers.Tokenizer` the engine uses."""

    def __init__(self, spec: dict[str, Any]) -> None:
        model = spec.get("model") or {}
        if model.get("type") != "BPE":
            raise UnsupportedTokenizer(f"model type {model.get('type')!r} (only BPE)")
        if model.get("dropout") or model.get("byte_fallback") or model.get("continuing_subword_prefix") \
                or model.get("end_of_word_suffix"):
            raise UnsupportedTokenizer("BPE dropout, byte fallback or subword affixes")
        self.vocab: dict[str, int] = dict(model["vocab"])
        self.ignore_merges = bool(model.get("ignore_merges"))
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        added_tokens = spec.get("added_tokens") or []
        self.added = {t["content"]: t["id"] for t in added_tokens}
        self.special_ids = {t["id"] for t in added_tokens if t.get("special")}
        for content, i in self.added.items():
            self.vocab.setdefault(content, i)
        self.by_id = {i: t for t, i in self.vocab.items()}
        for t in added_tokens:
            self.by_id[t["id"]] = t["content"]
        # Matched in the raw text first, then (normalized: true) in the normalized rest.
        self._raw_added = _AddedTokenMatcher([t for t in added_tokens if not t.get("normalized")])
        self._normalized_added = _AddedTokenMatcher([t for t in added_tokens if t.get("normalized")])
        self.normalizer = self._normalizer(spec.get("normalizer"))
        self.splits = self._pre_tokenizers(spec.get("pre_tokenizer"))
        self.prefix, self.suffix = self._template(spec.get("post_processor"))
        decoder = spec.get("decoder")
        if decoder is not None and decoder.get("type") != "ByteLevel":
            raise UnsupportedTokenizer(f"decoder {decoder.get('type')!r} (only ByteLevel)")
        self.b2u = byte_to_unicode()
        self._cache: dict[str, list[int]] = {}

    @classmethod
    def from_file(cls, path: str) -> "BpeTokenizer":
        with open(path, encoding="utf-8") as f:
            return cls(json.load(f))

    # -- configuration ---------------------------------------------------------------
    @staticmethod
    def _normalizer(spec: Optional[dict]):
        if spec is None:
            return None
        if spec.get("type") == "NFC":
            return lambda s: unicodedata.normalize("NFC", s)
        raise UnsupportedTokenizer(f"normalizer {spec.get('type')!r} (only NFC or none)")

    def _pre_tokenizers(self, spec: Optional[dict]) -> list[tuple[str, Any]]:
        """A list of ("split", compiled regex) and ("bytes", add_prefix_space) steps."""
        if spec is None:
            return [("bytes", False)]
        kind = spec.get("type")
        if kind == "Sequence":
            steps = []
            for part in spec["pretokenizers"]:
                steps.extend(self._pre_tokenizers(part))
            return steps
        if kind == "ByteLevel":
            steps = [("split", regex.compile(_BYTE_LEVEL_PATTERN))] if spec.get("use_regex", True) else []
            return steps + [("bytes", bool(spec.get("add_prefix_space")))]
        if kind == "Split":
            if spec.get("behavior") != "Isolated" or spec.get("invert"):
                raise UnsupportedTokenizer(f"Split behavior {spec.get('behavior')!r} (only Isolated)")
            pattern = spec["pattern"]
            source = pattern["Regex"] if "Regex" in pattern else regex.escape(pattern["String"])
            return [("split", regex.compile(source))]
        raise UnsupportedTokenizer(f"pre-tokenizer {kind!r}")

    def _template(self, spec: Optional[dict]) -> tuple[list[int], list[int]]:
        if spec is None or spec.get("type") == "ByteLevel":
            return [], []
        if spec.get("type") == "Sequence":
            prefix, suffix = [], []
            for part in spec["processors"]:
                p, s = self._template(part)
                prefix, suffix = prefix + p, suffix + s
            return prefix, suffix
        if spec.get("type") != "TemplateProcessing":
            raise UnsupportedTokenizer(f"post-processor {spec.get('type')!r}")
        prefix, suffix, seen = [], [], False
        for item in spec["single"]:
            if "Sequence" in item:
                seen = True
            else:
                ids = spec["special_tokens"][item["SpecialToken"]["id"]]["ids"]
                (suffix if seen else prefix).extend(ids)
        return prefix, suffix

    # -- encoding -----------------------------------------------------------------------
    def _pieces(self, text: str) -> list[str]:
        pieces = [text]
        for kind, arg in self.splits:
            if kind == "split":
                out = []
                for piece in pieces:
                    pos = 0
                    for m in arg.finditer(piece):
                        if m.start() > pos:
                            out.append(piece[pos:m.start()])
                        out.append(m.group())
                        pos = m.end()
                    if pos < len(piece):
                        out.append(piece[pos:])
                pieces = out
            else:
                if arg and pieces and not pieces[0].startswith(" "):
                    pieces[0] = " " + pieces[0]
                pieces = ["".join(self.b2u[b] for b in p.encode("utf-8")) for p in pieces]
        return [p for p in pieces if p]

    def _bpe(self, word: str) -> list[int]:
        cached = self._cache.get(word)
        if cached is not None:
            return cached
        if self.ignore_merges and word in self.vocab:
            ids = [self.vocab[word]]
        else:
            symbols = _merge(word, self.ranks)
            try:
                ids = [self.vocab[s] for s in symbols]
            except KeyError as e:
                raise UnsupportedTokenizer(f"symbol {e.args[0]!r} is not in the vocabulary (no unk token)") from None
        if len(self._cache) < 100_000 and len(word) <= _CACHED_WORD_CHARS:
            self._cache[word] = ids
        return ids

    def encode(self, text: str, add_special_tokens: bool = True) -> Encoding:
        ids: list[int] = []
        for raw, token_id in self._raw_added.split(text):
            if token_id is not None:
                ids.append(token_id)
                continue
            normalized = self.normalizer(raw) if self.normalizer is not None else raw
            for chunk, inner_id in self._normalized_added.split(normalized):
                if inner_id is not None:
                    ids.append(inner_id)
                    continue
                for piece in self._pieces(chunk):
                    ids.extend(self._bpe(piece))
        if add_special_tokens:
            ids = self.prefix + ids + self.suffix
        return Encoding(ids)

    # -- decoding -----------------------------------------------------------------------
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        buf = bytearray()
        for i in ids:
            token = self.by_id.get(i)
            if token is None or (skip_special_tokens and i in self.special_ids):
                continue
            data = byte_level_bytes(token)
            buf.extend(token.encode("utf-8") if data is None else data)
        return buf.decode("utf-8", errors="replace")

    def id_to_token(self, i: int) -> Optional[str]:
        return self.by_id.get(i)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.vocab.get(token)

    def get_vocab_size(self) -> int:
        return max(self.by_id) + 1 if self.by_id else 0

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        return dict(self.vocab)
