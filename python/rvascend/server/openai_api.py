"""The OpenAI-compatible endpoints: /v1/completions, /v1/chat/completions, /v1/models."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any, Callable, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from rvascend.engine import SamplingParams
from rvascend.server import limits, responses
from rvascend.server.context import BAD_INPUT, ServerContext
from rvascend.server.protocol import ChatCompletionRequest, CompletionRequest, UnsupportedField
from rvascend.server.responses import LogprobFormat, error
from rvascend.server import tool_calls
from rvascend.server.chat_output import THINK_END, ChatOutput, starts_in_reasoning
from rvascend.server.streaming import stream_events
from rvascend.server.structured_output import request_grammar
from rvascend.server.submission import Submission

DEFAULT_COMPLETION_TOKENS = 16
DEFAULT_CHAT_TOKENS = 256


def openai_routes(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest, request: Request):
        try:
            req.check_supported()
            if req.echo and req.logprobs is not None:
                raise UnsupportedField("echo with logprobs (prompt log-probabilities) is not supported")
            prompts = req.prompts()
            ids = [await ctx.tokenize(f"prompt[{i}]" if len(prompts) > 1 else "prompt", p) if isinstance(p, str)
                   else list(p) for i, p in enumerate(prompts)]
            for s in req.stop_list():
                limits.check_text("stop", s)
            grammar = await ctx.grammar(request_grammar(req.model_extra or {}))
            pairs = [(p, req.sampling_params(ctx.max_tokens_for(len(p), DEFAULT_COMPLETION_TOKENS, req.max_tokens),
                                             req.logprobs, j, grammar)) for p in ids for j in range(req.n)]
            echo = None
            if req.echo:
                echo = [p if isinstance(p, str) else (ctx.tokenizer.decode(p) if ctx.tokenizer else "")
                        for p in prompts]
        except BAD_INPUT as e:
            return error(400, str(e))
        return await _serve(ctx, "completions", pairs, req.n, req.stream, False, req.include_usage,
                            req.logprobs is not None, request, echo)

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        try:
            pairs, split = await prepare_chat(ctx, req)
            logprobs = req.requested_logprobs()
        except BAD_INPUT as e:
            return error(400, str(e))
        return await _serve(ctx, "chat", pairs, req.n, req.stream, True, req.include_usage, logprobs is not None,
                            request, split=split)

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": ctx.model_name, "object": "model", "created": 0,
                                            "owned_by": "rvascend", "root": ctx.model_name,
                                            "max_model_len": ctx.engine.context_length}]}

    return router


async def prepare_chat(ctx: ServerContext, req: ChatCompletionRequest
                       ) -> tuple[list[tuple[list[int], SamplingParams]], Callable[[], ChatOutput]]:
    """A chat request's engine requests (prompt ids, sampling parameters) for each of its
    choices, and the splitter of each choice's output (reasoning, content, tool calls).
    The Responses and Messages APIs translate their requests into a ChatCompletionRequest
    and come here too: one implementation of templates, tools and constraints. Raises
    BAD_INPUT's errors (a 400)."""
    req.check_supported()
    logprobs = req.requested_logprobs()
    messages = []
    for i, m in enumerate(req.messages):
        fields = m.template_fields()
        limits.check_text(f"messages[{i}].content", fields["content"])
        messages.append(fields)
    if ctx.tokenizer is None:
        raise limits.InputError("this server has no tokenizer: chat needs one")
    tools = tool_calls.tool_request(req.tools, req.tool_choice, req.parallel_tool_calls)
    add, cont, kwargs = req.template_options()
    if tools is not None and tools.offered:
        kwargs["tools"] = tools.offered  # as transformers' apply_chat_template(tools=...) passes them
    # Off the event loop: a model file's template is untrusted code (its budget
    # bounds the render, tokenizer/template_budget.py), and /health must not wait.
    prompt = await asyncio.to_thread(ctx.tokenizer.apply_chat_template, messages, add, cont, kwargs)
    ids = await ctx.tokenize("the chat prompt", prompt, add_special_tokens=False)
    for s in req.stop_list():
        limits.check_text("stop", s)
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    grammar = request_grammar(req.model_extra or {})
    calls = tool_calls.call_grammar(tools, ctx.tool_call_parser) if tools is not None else None
    if grammar is not None and calls is not None:
        raise UnsupportedField("give one output constraint, not a response format and a required tool call")
    grammar = await ctx.grammar(grammar or calls)
    reasoning = ctx.reasoning_parser is not None
    in_reasoning = reasoning and starts_in_reasoning(prompt)
    after = ctx.reasoning_end_ids() if reasoning and grammar is not None and (
        in_reasoning or not prompt.rstrip().endswith(THINK_END)) else ()
    pairs = [(ids, req.sampling_params(ctx.max_tokens_for(len(ids), DEFAULT_CHAT_TOKENS, max_tokens),
                                       logprobs, j, grammar, after)) for j in range(req.n)]
    # Each choice splits its own text (reasoning, content, tool calls).
    split = functools.partial(ChatOutput, reasoning, in_reasoning, tools, ctx.tool_call_parser)
    return pairs, split


async def _serve(ctx: ServerContext, endpoint: str, pairs: list[tuple[list[int], SamplingParams]], n: int,
                 stream: bool, chat: bool, include_usage: bool, logprobs: bool, request: Request,
                 echo: Optional[list[str]] = None, split: Optional[Callable[[], ChatOutput]] = None):
    sub = ctx.submit(endpoint, pairs, request)
    if isinstance(sub, Response):
        return sub
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    fmt = LogprobFormat(ctx.tokenizer, chat) if logprobs and ctx.tokenizer else None
    head = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": ctx.model_name}
    if stream:
        return StreamingResponse(_stream(ctx, endpoint, sub, head, n, chat, include_usage, fmt, echo, split),
                                 media_type="text/event-stream")
    states, failure = await ctx.collect(endpoint, sub, request)
    if failure is not None:
        return failure
    choices = [responses.choice(i, s, chat, fmt, echo[i // n] if echo else "", split() if split else None)
               for i, s in enumerate(states)]
    return {**head, "choices": choices, "usage": responses.usage(sub.seqs, n)}


def _stream(ctx: ServerContext, endpoint: str, sub: Submission, head: dict[str, Any], n: int, chat: bool,
            include_usage: bool, fmt: Optional[LogprobFormat], echo: Optional[list[str]],
            split: Optional[Callable[[], ChatOutput]] = None):
    kind = {**head, "object": "chat.completion.chunk" if chat else "text_completion"}
    started: set[int] = set()
    offsets: dict[int, responses.TextOffsets] = {}
    outputs: dict[int, ChatOutput] = {}

    def event(index: int, out) -> Optional[dict[str, Any]]:
        first = index not in started
        started.add(index)
        # One chunk per generated token, even when its text is held back (a
        # partial UTF-8 character, a possible stop string): clients and
        # benchmarks see every token's timing.
        if out.token_id is None and not out.finished and not first:
            return None
        prefix = echo[index // n] if echo and first else ""
        if fmt and first:
            offsets[index] = responses.TextOffsets(ctx.tokenizer, len(prefix))
        if split is not None and first:
            outputs[index] = split(stream=True)
        return {**kind, "choices": [responses.chunk_choice(index, out, chat, fmt, first=first, prefix=prefix,
                                                           offsets=offsets.get(index), split=outputs.get(index))]}

    def usage() -> Optional[dict[str, Any]]:
        return {**kind, "choices": [], "usage": responses.usage(sub.seqs, n)} if include_usage else None

    return stream_events(ctx, endpoint, sub, event, usage)
