"""Constrained decoding: a request's output held to a JSON schema, a regex, an EBNF
grammar or a list of choices, with llguidance (pinned in requirements.txt; it
publishes riscv64 wheels, so the host and the board run the same engine).

A Grammar is what a request asks for (hashable, in SamplingParams). The engine's
GrammarBackend compiles it once against the model's tokenizer (the compiled
matchers are kept, most recent first, so an agent that sends one schema with
every call compiles it once) and gives each sequence its own matcher. Every step,
the masks of the constrained rows are computed while the model runs (llguidance
drops the GIL), applied to their logits before sampling, greedy or not, and the
sampled token is fed to the matcher when the step commits (a step that fails
leaves every matcher as it was).

Work is bounded: a grammar's text is at most MAX_GRAMMAR_BYTES, and llguidance's
parser limits (fuel per token, grammar size) bound compiling and each mask.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import json
import threading
from typing import Literal

import torch
from absl import logging

KINDS = ("json_schema", "json_object", "regex", "ebnf", "choice", "lark")
MAX_GRAMMAR_BYTES = 128 * 1024
MAX_CHOICES = 1024
_COMPILED_KEPT = 64


class GrammarError(ValueError):
    """A grammar that cannot be served: its problem, named (a 400)."""


@dataclasses.dataclass(frozen=True)
class Grammar:
    """What a request's output must match. `source`: the JSON schema as JSON text
    (json_schema), the regex, the EBNF text (GBNF, llama.cpp's dialect, or Lark), or
    the choices as a JSON list of strings; empty for json_object (any JSON object); lark:
    llguidance's Lark dialect, which the server builds itself (tool calls), never a client."""
    kind: Literal["json_schema", "json_object", "regex", "ebnf", "choice", "lark"]
    source: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise GrammarError(f"grammar kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if len(self.source.encode("utf-8")) > MAX_GRAMMAR_BYTES:
            raise GrammarError(f"the {self.kind} is {len(self.source.encode('utf-8'))} bytes; at most "
                               f"{MAX_GRAMMAR_BYTES} are served")

    @classmethod
    def choice(cls, options: list[str]) -> "Grammar":
        if not options or len(options) > MAX_CHOICES or not all(isinstance(o, str) and o for o in options):
            raise GrammarError(f"choices must be 1 to {MAX_CHOICES} non-empty strings")
        return cls("choice", json.dumps(options))

    @classmethod
    def json_schema(cls, schema: object) -> "Grammar":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise GrammarError("a JSON schema is an object (or true / false)")
        return cls("json_schema", json.dumps(schema))


# JSON as Python's json.dumps writes it: no whitespace but after "," and ":". Flexible
# whitespace would let a model emit blank lines without end inside an object.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def llguidance_grammar(grammar: Grammar) -> str:
    """The grammar in llguidance's own form (its JSON grammar text)."""
    import llguidance

    if grammar.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(grammar.source, defaults=JSON_LAYOUT)
    if grammar.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if grammar.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(grammar.source)
    if grammar.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(grammar.source)
    if grammar.kind == "choice":
        # Lark string literals take JSON's escapes.
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(option) for option in json.loads(grammar.source)))
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        lark = any_to_lark(grammar.source)
    except Exception as e:  # noqa: BLE001 - the converter's own errors name the problem
        raise GrammarError(f"the EBNF grammar does not parse: {e}") from None
    return llguidance.LLMatcher.grammar_from_lark(lark)


class GrammarBackend:
    """One engine's grammar engine: the tokenizer in llguidance's form, compiled
    grammars, and the thread that fills a step's masks while the model runs."""

    def __init__(self, tokenizer_json: str, vocab: int, eos_ids: list[int]) -> None:
        import llguidance

        self.vocab = vocab
        self._tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab, eos_token=sorted(eos_ids))
        self._eos_ids = frozenset(eos_ids)
        self._eos_only = torch.zeros(vocab, dtype=torch.bool)
        self._eos_only[[t for t in eos_ids if 0 <= t < vocab]] = True
        self._compiled: collections.OrderedDict[Grammar, object] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._executor = llguidance.LLExecutor(num_threads=1)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="grammar-masks")

    def compile(self, grammar: Grammar):
        """A fresh matcher at the start of `grammar` (compiled once and kept); GrammarError
        naming the problem if llguidance refuses it. Compiling drops the GIL: call it off
        the server's event loop."""
        import llguidance

        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled.deep_copy()
        try:
            text = llguidance_grammar(grammar)
        except ValueError as e:
            raise GrammarError(f"the {grammar.kind} is not valid: {e}") from None
        matcher = llguidance.LLMatcher(self._tokenizer, text, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"the {grammar.kind} is not served: {matcher.get_error()}")
        with self._lock:
            self._compiled[grammar] = matcher
            while len(self._compiled) > _COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return matcher.deep_copy()

    def masks_later(self, rows: list[tuple[object, list[int]]]) -> "concurrent.futures.Future[list[torch.Tensor]]":
        """Per (matcher, draft): its next-token masks at the draft's positions (bool
        [1 + len(draft), vocab]: True where allowed; row i after the draft's first i tokens),
        computed on the backend's thread while the model runs. The draft must be valid
        (validate_tokens); the matchers are rolled back to where they were before the
        future completes."""
        return self._thread.submit(self._draft_masks, rows)

    def _draft_masks(self, rows: list[tuple[object, list[int]]]) -> list[torch.Tensor]:
        out = [torch.empty(1 + len(draft), self.vocab, dtype=torch.bool) for _, draft in rows]
        consumed = [0] * len(rows)
        ended = [False] * len(rows)  # the draft so far ends in EOS
        try:
            for i in range(1 + max(len(draft) for _, draft in rows)):
                live = [j for j, (_, draft) in enumerate(rows) if i <= len(draft) and not ended[j]]
                masks = self._masks([rows[j][0] for j in live]) if live else []
                for mask, j in zip(masks, live):
                    out[j][i] = mask
                    matcher, draft = rows[j]
                    if i == len(draft):
                        continue
                    if draft[i] in self._eos_ids:
                        # llguidance's rollback does not count an EOS it consumed, so a drafted EOS
                        # is never fed to the matcher: after it, only EOS (the sequence has ended).
                        ended[j] = True
                        out[j][i + 1:] = self._eos_only
                        continue
                    if not matcher.consume_token(draft[i]):
                        # The matcher's message holds its parser state: the log's, not the client's.
                        logging.warning("draft token %d refused by the grammar: %s", draft[i], matcher.get_error())
                        raise GrammarError(f"the draft token {draft[i]} is not in the grammar")
                    consumed[j] += 1
        finally:
            for (matcher, _), n in zip(rows, consumed):
                if n:
                    matcher.rollback(n)
        return out

    def _masks(self, matchers: list) -> torch.Tensor:
        words = (self.vocab + 31) // 32
        bits = torch.zeros(len(matchers), words, dtype=torch.int32)
        self._executor.unsafe_compute_mask_ptr([(m, i) for i, m in enumerate(matchers)], bits.data_ptr(),
                                               words * 4, len(matchers))
        shifts = torch.arange(32, dtype=torch.int32)
        return ((bits.unsqueeze(-1) >> shifts) & 1).reshape(len(matchers), words * 32)[:, :self.vocab].bool()
