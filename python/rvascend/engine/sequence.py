"""A request's state in the engine and its sampling parameters."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import time
from typing import Callable, Optional

import torch

_ids = itertools.count()


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: Optional[int] = None
    ignore_eos: bool = False

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
    finish_reason: Optional[str]  # "stop" | "length" | "abort"


class Sequence:
    def __init__(self, prompt_ids: list[int], params: SamplingParams,
                 on_output: Optional[Callable[["Sequence", Output], None]] = None) -> None:
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.params = params
        self.on_output = on_output
        self.status = Status.WAITING
        self.slots: list[int] = []
        self.reserved = len(prompt_ids) + params.max_tokens
        self.generator: Optional[torch.Generator] = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.text = ""        # decoded output so far
        self.emitted = 0      # characters of self.text already handed out
        self.finish_reason: Optional[str] = None
        self.aborted = False
        self.arrival = time.perf_counter()
        self.first_token_time: Optional[float] = None
        self.token_times: list[float] = []

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]
