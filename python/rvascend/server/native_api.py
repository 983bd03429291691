"""SGLang's native endpoints: /generate, /tokenize, /detokenize, /model_info and
/server_info (and their older names /get_model_info, /get_server_info), /get_load
(their field names and shapes are SGLang's: sglang-router reads them)."""

from __future__ import annotations

import os
import uuid
from typing import Any, Optional

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import rvascend
from rvascend.engine import SamplingParams
from rvascend.engine.sequence import Sequence
from rvascend.server import limits, responses
from rvascend.server.context import BAD_INPUT, ServerContext
from rvascend.server.protocol import GenerateRequest, UnsupportedField, load_json
from rvascend.server.responses import ChoiceState, error
from rvascend.server.streaming import stream_events
from rvascend.server.structured_output import SGLANG_SAMPLING_KEYS, sampling_params_grammar


def native_routes(ctx: ServerContext) -> APIRouter:
    router = APIRouter()

    @router.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        try:
            req.check_supported()
            if (req.text is None) == (req.input_ids is None):
                raise limits.InputError("give exactly one of 'text' and 'input_ids'")
            ids = await ctx.tokenize("text", req.text) if req.text is not None else list(req.input_ids)
            params = _sglang_params(req, len(ids), ctx.engine.context_length)
            await ctx.grammar(params.grammar)
        except BAD_INPUT as e:
            return error(400, str(e))
        sub = ctx.submit("generate", [(ids, params)], request)
        if isinstance(sub, Response):
            return sub
        rid = req.rid or uuid.uuid4().hex
        state = ChoiceState()

        def body(seq: Sequence) -> dict[str, Any]:
            reason = None
            if state.reason:
                reason = {"type": responses.openai_reason(state.reason)}
                if state.matched_stop is not None:
                    reason["matched"] = state.matched_stop
            meta = {"id": rid, "prompt_tokens": len(seq.prompt_ids), "cached_tokens": seq.cached_tokens,
                    "completion_tokens": len(seq.output_ids), "finish_reason": reason}
            if req.return_logprob:
                meta.update(_logprob_fields(ctx, seq, state, req.return_text_in_logprobs))
            return {"text": "".join(state.text), "output_ids": list(seq.output_ids), "meta_info": meta}

        if req.stream:
            def event(index: int, out) -> dict[str, Any]:
                state.add(out)
                return body(sub.seqs[0])
            return StreamingResponse(stream_events(ctx, "generate", sub, event), media_type="text/event-stream")
        (state,), failure = await ctx.collect("generate", sub, request)
        return failure if failure is not None else body(sub.seqs[0])

    _info_routes(router, ctx)
    _token_routes(router, ctx)
    return router


def _info_routes(router: APIRouter, ctx: ServerContext) -> None:
    """SGLang's model and server information and its load report (for sglang-router)."""
    async def model_info():
        return {"model_path": ctx.model_name, "tokenizer_path": _tokenizer_dir(ctx.server_args.get("model_path")),
                "is_generation": True, "max_model_len": ctx.engine.context_length,
                "vocab_size": ctx.engine.model.config.vocab_size}

    async def server_info():
        return {**ctx.server_args, "version": rvascend.__version__, "context_length": ctx.engine.context_length,
                **ctx.engine.stats()}

    for path, handler in (("/model_info", model_info), ("/get_model_info", model_info),
                          ("/server_info", server_info), ("/get_server_info", server_info)):
        router.add_api_route(path, handler, methods=["GET"], operation_id=path.strip("/"))

    @router.get("/get_load")
    async def get_load():
        # One entry per data-parallel rank (one here); the router balances on num_tokens.
        stats = ctx.engine.stats()
        return [{"dp_rank": 0, "num_reqs": stats["running"] + stats["waiting"], "num_waiting_reqs": stats["waiting"],
                 "num_tokens": stats["kv_used_tokens"]}]


def _token_routes(router: APIRouter, ctx: ServerContext) -> None:
    """/tokenize and /detokenize."""
    @router.post("/tokenize")
    async def tokenize(request: Request):
        body = await _json_object(request)
        text = body.get("prompt", body.get("text"))
        if not isinstance(text, str):
            return error(400, "'prompt' must be a string")
        add = body.get("add_special_tokens", True)
        try:
            ids = await ctx.tokenize("prompt", text, bool(add)) if text else []
        except BAD_INPUT as e:
            return error(400, str(e))
        return {"tokens": ids, "count": len(ids), "max_model_len": ctx.engine.context_length}

    @router.post("/detokenize")
    async def detokenize(request: Request):
        body = await _json_object(request)
        ids = body.get("tokens")
        vocab = ctx.engine.model.config.vocab_size
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return error(400, "'tokens' must be a list of token ids")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            return error(400, f"token id {bad[0]} is outside the vocabulary of {vocab}")
        if ctx.tokenizer is None:
            return error(400, "this server has no tokenizer")
        return {"prompt": ctx.tokenizer.decode(ids)}


def _tokenizer_dir(model_path: Optional[str]) -> Optional[str]:
    """The checkpoint directory when it holds a Hugging Face tokenizer (a router on the same
    machine loads it from there); None for a GGUF file, whose tokenizer is its own metadata."""
    if model_path and os.path.isfile(os.path.join(model_path, "tokenizer.json")):
        return model_path
    return None


def _logprob_fields(ctx: ServerContext, seq: Sequence, state: ChoiceState, with_text: bool) -> dict[str, Any]:
    """SGLang's meta_info log-probabilities: [logprob, token id, text or None] per
    token, and per token the top ones in the same shape (None where not asked)."""
    def entry(token: int, logprob: Optional[float]) -> list:
        text = ctx.tokenizer.token_text(token) if with_text and ctx.tokenizer else None
        return [logprob, token, text]

    def tops(top) -> Optional[list]:
        return None if top is None else [entry(t, v) for t, v in top]

    asked_top = seq.params.logprobs and seq.params.logprobs > 0
    fields = {"output_token_logprobs": [entry(t, lp) for t, lp in zip(state.tokens, state.logprobs)],
              "output_top_logprobs": [tops(t) for t in state.top] if asked_top else None}
    if seq.params.logprob_start_len >= 0:
        fields["input_token_logprobs"] = [entry(t, lp) for t, lp, _ in seq.input_logprobs]
        fields["input_top_logprobs"] = [tops(top) for _, _, top in seq.input_logprobs] if asked_top else None
    return fields


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = load_json("the body", await request.body())
    except UnsupportedField as e:
        raise StarletteHTTPException(400, str(e)) from None
    if not isinstance(body, dict):
        raise StarletteHTTPException(400, "the body must be a JSON object")
    return body


# SGLang's sampling_params names -> ours.
_SGLANG_PARAMS = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                  "top_k": "top_k", "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                  "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                  "min_new_tokens": "min_tokens", "stop": "stop", "stop_token_ids": "stop_token_ids",
                  "ignore_eos": "ignore_eos", "seed": "seed", "sampling_seed": "seed",
                  "skip_special_tokens": "skip_special_tokens"}


def _sglang_params(req: GenerateRequest, prompt_len: int, context_length: int) -> SamplingParams:
    kwargs: dict[str, Any] = {"grammar": sampling_params_grammar(req.sampling_params)}
    for key, value in req.sampling_params.items():
        if key in SGLANG_SAMPLING_KEYS:
            continue
        if key not in _SGLANG_PARAMS:
            raise UnsupportedField(f"sampling_params.{key} is not supported by this server")
        name = _SGLANG_PARAMS[key]
        if value is None:  # SGLang's null: the default
            continue
        expected = SamplingParams.__dataclass_fields__[name].type
        if name == "stop":
            value = (value,) if isinstance(value, str) else value
            if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
                raise limits.InputError("sampling_params.stop must be a string or a list of strings")
            for s in value:
                limits.check_text("stop", s)
            value = tuple(value)
        elif name == "stop_token_ids":
            if not isinstance(value, list) or not all(isinstance(t, int) for t in value):
                raise limits.InputError("sampling_params.stop_token_ids must be a list of token ids")
            value = tuple(value)
        elif name in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(value, bool):
                raise limits.InputError(f"sampling_params.{key} must be a boolean")
        elif "float" in str(expected):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise limits.InputError(f"sampling_params.{key} must be a number")
            value = float(value)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise limits.InputError(f"sampling_params.{key} must be an integer")
        kwargs[name] = value
    kwargs.setdefault("max_tokens", max(1, min(128, context_length - prompt_len)))
    if req.return_logprob:
        kwargs.update(logprobs=req.top_logprobs_num, logprob_start_len=req.logprob_start_len)
    return SamplingParams(**kwargs)
