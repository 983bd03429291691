"""A request's state in the engine and its sampling parameters."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from typing import Callable, Optional

import torch

from rvascend.engine.grammar import Grammar

_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """What one request asks of the sampler (OpenAI's and SGLang's meanings)."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                   # <= 0: off
    min_p: float = 0.0
    repetition_penalty: float = 1.0   # over prompt + output tokens (1: off)
    frequency_penalty: float = 0.0    # per occurrence in the output
    presence_penalty: float = 0.0     # once per token present in the output
    min_tokens: int = 0               # EOS and stop_token_ids masked until then
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: Optional[int] = None    # None: off; k: the sampled token's and the k most likely
    seed: Optional[int] = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True  # special tokens' text left out of the output text
    # Prompt log-probabilities from this prompt position on (SGLang's
    # logprob_start_len; needs logprobs set); -1: output tokens only.
    logprob_start_len: int = -1
    grammar: Optional[Grammar] = None  # what the output must match (engine/grammar.py)
    # With a grammar: the tokens that end the reasoning it applies after (a reasoning model's
    # "</think>", as SGLang applies a grammar); empty: from the first token.
    grammar_after: tuple[int, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclasses.dataclass
class Output:
    """What one step produced for a sequence."""

    text: str                     # new text, stop strings held back until resolved
    token_id: Optional[int]
    finished: bool
    finish_reason: Optional[str]  # "stop" | "length" | "abort" | "error"
    logprob: Optional[float] = None                       # of token_id, when asked for
    top_logprobs: Optional[list[tuple[int, float]]] = None
    error: Optional[str] = None   # with finish_reason "error": what failed
    matched_stop: Optional[object] = None  # the stop string or token id that ended it


class Sequence:
    def __init__(self, prompt_ids: list[int], params: SamplingParams,
                 on_output: Optional[Callable[["Sequence", Output], None]] = None) -> None:
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.on_output = on_output
        self.status = Status.WAITING
        self.slots: list[int] = []   # changes only by extend() or by assigning a new list
        self._slot_buffer = torch.empty(0, dtype=torch.long)  # self.slots[:_mirrored_len] as int64
        self._slot_view = self._slot_buffer.numpy()  # the same memory, written without torch's indexing
        self._mirrored: Optional[list[int]] = None
        self._mirrored_len = 0
        self.prefilled = 0    # prompt tokens already in the KV pool (chunked prefill)
        self.cached_tokens = 0  # of which taken from the prefix cache
        self.cache_node = None  # the prefix-cache node this request pins (engine/prefix_cache.py)
        # Hybrid models: the recurrent-state slot holding its state, and the slots its next step
        # writes: one, or one per token it verifies (engine/engine.py; the slot holding the
        # state after its last kept token becomes state_slot when the step commits).
        self.state_slot: Optional[int] = None
        self.spare_state_slots: list[int] = []
        # Where its next step reads its states when not its state_slot: a cached snapshot it
        # resumes after (state_source, the prefix-cache node pinning it), or a snapshot of its
        # own taken at its last chunk's end. Cleared when a step commits.
        self.state_read_from: Optional[int] = None
        self.state_source = None
        # (tokens, snapshot slot): the states after that many of its tokens, kept for the
        # prefix cache until its tokens are inserted (engine/scheduler.py).
        self.pending_snapshots: list[tuple[int, int]] = []
        self.pages_read = False  # the hierarchical cache read its prompt's pages into memory
        self.owner: Optional[str] = None  # who sent it (a digest of its API key): SUFFIX drafts stay within it
        self.reservation = len(prompt_ids) + params.max_tokens  # KV tokens it may need
        self.reserved = 0     # of which the engine has reserved for it (from admission to release)
        # Output token i is drawn with generator_at(i): unseeded, the seed comes from torch's
        # global generator (so torch.manual_seed still repeats a run).
        self.sampling_seed = params.seed if params.seed is not None else int(torch.randint(2**62, ()).item())
        self.text = ""        # decoded output so far
        self.emitted = 0      # characters of self.text already handed out
        self.detokenizer = None  # set by the engine when it has a tokenizer
        self.matcher = None      # with params.grammar: where its output is in the grammar (llguidance)
        # Speculative decoding (engine/ngram_draft.py): this step's draft, the n-gram index of
        # its tokens and how many it drafts next.
        self.draft: list[int] = []
        self.mtp_draft: list[int] = []  # NEXTN, STANDALONE: the drafting model's draft for the next step
        self.draft_synced: Optional[int] = None  # STANDALONE: its positions before this are in the draft's pool
        self.ngram = None
        self.draft_budget = None
        self.grammar_active = not params.grammar_after  # the grammar holds from the next token on
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None
        self.aborted = False
        # Prompt tokens' (token, logprob, top logprobs) from params.logprob_start_len on.
        self.input_logprobs: list[tuple[int, float, Optional[list[tuple[int, float]]]]] = []
        self.weights_generation = 0  # the model weights its K/V were computed with (engine/engine.py)
        self.arrival = time.perf_counter()
        self.first_token_time: Optional[float] = None
        self.token_times: list[float] = []

    def kv_slot_tensor(self, fresh: list[int]) -> torch.Tensor:
        """self.slots then `fresh` as an int64 view of a buffer kept in step with self.slots:
        only the slots added since the last call cross from Python. (Converting the whole list
        every step cost a 4096-token context 3.7M instructions per step on riscv64; writing them
        through a numpy view of the buffer, not torch's indexing, cut a decode step's call from
        12 to 2 us warm on x86.) The view is valid until the next call."""
        if self._mirrored is not self.slots or self._mirrored_len > len(self.slots):
            self._mirrored, self._mirrored_len = self.slots, 0
        n, need = len(self.slots), len(self.slots) + len(fresh)
        if self._slot_buffer.numel() < need:
            grown = torch.empty(max(need, 2 * self._slot_buffer.numel(), 64), dtype=torch.long)
            grown[:self._mirrored_len] = self._slot_buffer[:self._mirrored_len]
            self._slot_buffer, self._slot_view = grown, grown.numpy()
        if self._mirrored_len < n:
            self._slot_view[self._mirrored_len:n] = self.slots[self._mirrored_len:]
            self._mirrored_len = n
        if fresh:
            self._slot_view[n:need] = fresh
        return self._slot_buffer[:need]

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def generator_at(self, index: int) -> torch.Generator:
        """The generator that draws output token `index`, one per position: a step's draws
        change nothing a failed step would have to undo, and a drafting model draws its
        proposal for a position with the noise the target's draw will meet there
        (sampler.propose)."""
        return torch.Generator().manual_seed(_position_seed(self.sampling_seed, index))

    def tokens(self, start: int, end: int) -> list[int]:
        """Its tokens at positions start .. end - 1 (prompt, then output), without joining the
        whole of them."""
        if start >= end:
            return []
        n = len(self.prompt_ids)
        return self.prompt_ids[start:min(end, n)] + self.output_ids[max(start - n, 0):max(end - n, 0)]

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]


_MASK64 = 2**64 - 1


def _position_seed(seed: int, index: int) -> int:
    """splitmix64 of the seed stepped `index + 1` times: neighbouring positions and seeds
    (n > 1 choices get seed + i) get unrelated streams."""
    z = (seed + (index + 1) * 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)
