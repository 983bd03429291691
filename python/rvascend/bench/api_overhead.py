"""What the Responses and Messages layers cost per request over chat completions.

Both APIs translate their request into a chat completion request and go on as chat does
(server/openai_api.prepare_chat): their own cost is reading their body and translating it.
Timed here on agent-sized requests, the steps themselves, interleaved in one run:
- chat: validating the equivalent chat body (what a chat request costs at this point);
- responses: validating a Codex-shaped body (instructions, a developer and a user message,
  a call and its output, 12 function tools), checking it and translating it (to_chat);
- messages: validating a Claude-Code-shaped body (system blocks, a tool_use / tool_result
  round, 20 tools with input_schema) and translating it (chat_request).
Then each API's stream formatting per generated token, its JSON text included (a chat
chunk, a Responses ResponseBuilder.feed, a Messages MessageStream.event).
Issue 62's bound: each layer's per-request cost under 1 ms on the host.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any, Callable

from absl import app, flags

from rvascend.bench.results import print_table, write_jsonl
from rvascend.engine.sequence import Output
from rvascend.server import responses
from rvascend.server.anthropic_api import MessageStream
from rvascend.server.anthropic_protocol import MessagesRequest, validated
from rvascend.server.chat_output import ChatOutput
from rvascend.server.protocol import ChatCompletionRequest
from rvascend.server.responses_api import ResponseBuilder
from rvascend.server.responses_protocol import ResponsesRequest

FLAGS = flags.FLAGS


def _define_flags() -> None:
    flags.DEFINE_integer("rounds", 2000, "Requests of each kind timed (interleaved).")
    flags.DEFINE_integer("tokens", 2000, "Tokens of stream formatting timed per API.")
    flags.DEFINE_string("output", "bench_results/api_overhead.jsonl", "jsonl file to append to.")


def _tool(i: int) -> dict[str, Any]:
    return {"name": f"tool_{i}", "description": "Does one thing an agent needs. " * 8,
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string", "description": "A file path."},
                "lines": {"type": "array", "items": {"type": "integer"}},
                "options": {"type": "object", "properties": {"recursive": {"type": "boolean"}}}},
                "required": ["path"]}}


def responses_body() -> dict[str, Any]:
    return {"model": "m", "instructions": "You are a coding agent. " * 400, "stream": True,
            "tools": [{"type": "function", **_tool(i)} for i in range(12)], "tool_choice": "auto",
            "include": ["reasoning.encrypted_content"], "store": False,
            "input": [{"type": "message", "role": "developer", "content": "Sandbox: workspace-write. " * 40},
                      {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the bug."}]},
                      {"type": "function_call", "call_id": "c1", "name": "tool_0", "arguments": '{"path": "a.py"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "def f():\n    return 1\n" * 50}]}


def messages_body() -> dict[str, Any]:
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
             for t in map(_tool, range(20))]
    return {"model": "m", "max_tokens": 32000, "stream": True, "tools": tools,
            "system": [{"type": "text", "text": "You are Claude Code. " * 1500,
                        "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Read a.py"}]},
                         {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "tool_0",
                                                            "input": {"path": "a.py"}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                       "content": "def f():\n    return 1\n" * 50}]}]}


def responses_front(body: dict[str, Any]) -> ChatCompletionRequest:
    req = ResponsesRequest.model_validate(body)
    req.check_supported()
    return req.to_chat([], req.input_items())


def messages_front(body: dict[str, Any]) -> ChatCompletionRequest:
    return validated(MessagesRequest, body).chat_request()


def _timed(steps: dict[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Each step's seconds per call, the steps interleaved round by round."""
    seconds: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def _stream_steps(tokens: int) -> dict[str, Callable[[], Any]]:
    """One token's formatting in each API's stream, its JSON text included (one stream each,
    `tokens` tokens long)."""
    out = Output(" word", 7, False, None)
    chat_split = lambda: ChatOutput(False, False, None, "qwen25", stream=True)  # noqa: E731
    state: dict[str, Any] = {}

    class _Seq:  # what MessageStream reads of a sequence: its usage counts
        prompt_ids, output_ids, cached_tokens = [1] * 100, [7], 0

    def chat():
        if "chat" not in state:
            state["chat"] = chat_split()
        json.dumps(responses.chunk_choice(0, out, True, None, split=state["chat"]))

    def responses_api():
        if "responses" not in state:
            state["responses"] = ResponseBuilder(ResponsesRequest.model_validate({"input": "x"}), "m", chat_split())
        for event in state["responses"].feed(out.text):
            json.dumps(event)

    def messages():
        if "messages" not in state:
            state["messages"] = MessageStream({"id": "msg", "type": "message"}, chat_split(), _Seq())
        for _, event in state["messages"].event(0, out) or ():
            json.dumps(event)

    return {"chat chunk": chat, "responses event": responses_api, "messages event": messages}


def main(argv: list[str]) -> int:
    del argv
    chat_body = responses_front(responses_body()).model_dump(exclude_none=True)
    claude_chat_body = messages_front(messages_body()).model_dump(exclude_none=True)
    fronts = {"chat (Codex-sized)": lambda: ChatCompletionRequest.model_validate(chat_body),
              "responses (Codex)": lambda: responses_front(responses_body()),
              "chat (Claude-Code-sized)": lambda: ChatCompletionRequest.model_validate(claude_chat_body),
              "messages (Claude Code)": lambda: messages_front(messages_body())}
    _timed(fronts, 50)  # warm-up
    seconds = _timed(fronts, FLAGS.rounds)
    seconds.update(_timed(_stream_steps(FLAGS.tokens), FLAGS.tokens))
    rows = [{"step": name, "median_ms": statistics.median(s) * 1e3, "p99_ms": sorted(s)[int(0.99 * len(s))] * 1e3}
            for name, s in seconds.items()]
    print_table(rows, [("step", "step", "s"), ("median_ms", "median ms", ".4f"), ("p99_ms", "P99 ms", ".4f")])
    med = {r["step"]: r["median_ms"] for r in rows}
    print(f"Responses layer per request: {med['responses (Codex)']:.3f} ms (chat's own validation of the same "
          f"request {med['chat (Codex-sized)']:.3f} ms); Messages layer: {med['messages (Claude Code)']:.3f} ms "
          f"(chat {med['chat (Claude-Code-sized)']:.3f} ms); bound 1 ms")
    write_jsonl(FLAGS.output, rows)
    return 0


if __name__ == "__main__":
    _define_flags()
    sys.exit(app.run(main))
