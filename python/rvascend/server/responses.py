"""OpenAI response bodies: choices, log-probabilities, stream chunks, usage, errors."""

from __future__ import annotations

import codecs
import dataclasses
import json
from typing import Any, Optional

from fastapi.responses import JSONResponse

from rvascend.server.chat_output import ChatOutput, chat_delta
from rvascend.engine.sequence import Output, Sequence
from rvascend.tokenizer.tokenizer import Tokenizer


def error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": status}}


def error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    """Every error a client sees has this one shape."""
    return JSONResponse(error_body(status, message, kind), status_code=status)


def sse(payload: Any) -> str:
    return "data: " + (payload if isinstance(payload, str) else json.dumps(payload)) + "\n\n"


def usage(seqs: list[Sequence], prompts_per_seq: int) -> dict[str, Any]:
    """Prompt tokens count once per prompt (n samples share it); cached_tokens: of
    those, the ones the prefix cache served (OpenAI's prompt_tokens_details)."""
    prompt = sum(len(s.prompt_ids) for s in seqs[::prompts_per_seq])
    cached = sum(s.cached_tokens for s in seqs[::prompts_per_seq])
    completion = sum(len(s.output_ids) for s in seqs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


@dataclasses.dataclass
class ChoiceState:
    """What one choice has produced so far."""

    text: list[str] = dataclasses.field(default_factory=list)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top: list[Optional[list[tuple[int, float]]]] = dataclasses.field(default_factory=list)
    reason: Optional[str] = None
    matched_stop: Any = None
    error: Optional[str] = None

    def add(self, out: Output) -> None:
        self.text.append(out.text)
        if out.logprob is not None and out.token_id is not None:
            self.tokens.append(out.token_id)
            self.logprobs.append(out.logprob)
            self.top.append(out.top_logprobs)
        if out.finished:
            self.reason = out.finish_reason
            self.matched_stop = out.matched_stop
            self.error = out.error


class TextOffsets:
    """Completions' text_offset: where each token starts, in characters of the text
    its bytes decode to (a character split over tokens starts after its last byte)."""

    def __init__(self, tokenizer: Tokenizer, start: int = 0) -> None:
        self.tok = tokenizer
        self.pos = start
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def advance(self, token: int) -> int:
        at = self.pos
        self.pos += len(self.decoder.decode(self.tok.token_bytes(token)))
        return at


class LogprobFormat:
    """Log-probabilities in the completions or the chat shape."""

    def __init__(self, tokenizer: Tokenizer, chat: bool) -> None:
        self.tok = tokenizer
        self.chat = chat

    def format(self, tokens: list[int], logprobs: list[float], top: list,
               offsets: Optional[TextOffsets] = None) -> dict[str, Any]:
        """`offsets` carries text_offset across calls (a stream's chunks); by default
        the offsets start at 0."""
        texts = [self.tok.token_text(t) for t in tokens]
        if self.chat:
            return {"content": [
                {"token": s, "logprob": lp, "bytes": list(self.tok.token_bytes(t)),
                 "top_logprobs": [{"token": self.tok.token_text(i), "logprob": v,
                                   "bytes": list(self.tok.token_bytes(i))} for i, v in (tp or ())]}
                for t, s, lp, tp in zip(tokens, texts, logprobs, top)]}
        offsets = offsets or TextOffsets(self.tok)
        return {"tokens": texts, "token_logprobs": logprobs, "text_offset": [offsets.advance(t) for t in tokens],
                "top_logprobs": [{self.tok.token_text(i): v for i, v in tp} if tp is not None else None
                                 for tp in top]}


def openai_reason(reason: Optional[str]) -> Optional[str]:
    """finish_reason within OpenAI's values ("abort" only reaches clients that left)."""
    return "stop" if reason == "abort" else reason


def choice(index: int, state: ChoiceState, chat: bool, logprobs: Optional[LogprobFormat],
           prefix: str = "", split: Optional[ChatOutput] = None) -> dict[str, Any]:
    """A whole choice; in chat, `split` makes its message's reasoning, content and tool calls."""
    text = prefix + "".join(state.text)
    c: dict[str, Any] = {"index": index, "finish_reason": openai_reason(state.reason),
                         "matched_stop": state.matched_stop,
                         "logprobs": logprobs.format(state.tokens, state.logprobs, state.top,
                                                      TextOffsets(logprobs.tok, len(prefix)))
                         if logprobs else None}
    if chat:
        c["message"] = {"role": "assistant", "content": text}
        if split is not None:
            c["message"], called = split.message(text)
            if called and state.reason == "stop":
                c["finish_reason"] = "tool_calls"
    else:
        c["text"] = text
    return c


def chunk_choice(index: int, out: Output, chat: bool, logprobs: Optional[LogprobFormat],
                 first: bool = False, prefix: str = "", offsets: Optional[TextOffsets] = None,
                 split: Optional[ChatOutput] = None) -> dict[str, Any]:
    """One output's chunk; in chat, `split` (the choice's own, fed every chunk in order)
    sends reasoning_content, content and tool_calls."""
    lp = None
    if logprobs and out.logprob is not None and out.token_id is not None:
        lp = logprobs.format([out.token_id], [out.logprob], [out.top_logprobs], offsets)
    reason = openai_reason(out.finish_reason) if out.finished else None
    if chat:
        delta: dict[str, Any] = {"role": "assistant"} if first else {}
        if split is None:
            if out.text:
                delta["content"] = out.text
        else:
            events = split.events(out.text) + (split.end() if out.finished else [])
            delta.update(chat_delta(events))
            if out.finished and split.calls and reason == "stop":
                reason = "tool_calls"
        c: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason, "logprobs": lp}
    else:
        c = {"index": index, "text": prefix + out.text, "finish_reason": reason, "logprobs": lp}
    if out.finished:
        c["matched_stop"] = out.matched_stop
    return c
