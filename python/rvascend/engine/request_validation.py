"""What a request may ask of the engine: checked before it is queued, so a request
the engine cannot serve as asked is refused by name (RequestError, a 400)."""

from __future__ import annotations

from rvascend.engine.sequence import SamplingParams


# Every generated token is checked against each stop string, stop token and bias:
# their count and length bound that per-token work (20,000 stop strings of 1,000
# characters once made a 4 ms step take 35 ms). OpenAI allows 4 stop strings.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024
MAX_LOGIT_BIAS = 1024


class RequestError(ValueError):
    """A request that can never be served as asked (the client's fault)."""


def validate_request(prompt_ids: list[int], params: SamplingParams, vocab: int, context_length: int,
                     pool_tokens: int) -> None:
    if not prompt_ids:
        raise RequestError("the prompt is empty")
    if params.max_tokens < 1:
        raise RequestError(f"max_tokens must be at least 1, got {params.max_tokens}")
    if len(prompt_ids) >= context_length:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context length is {context_length}")
    if len(prompt_ids) + params.max_tokens > context_length:
        raise RequestError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                           f"the context length of {context_length}")
    if len(prompt_ids) + params.max_tokens > pool_tokens:
        raise RequestError(f"prompt + max_tokens = {len(prompt_ids) + params.max_tokens} tokens exceeds the "
                           f"KV pool of {pool_tokens} tokens")
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"token id {bad[0]} is outside the vocabulary of {vocab}")
    if not 0.0 <= params.temperature <= 100.0:
        raise RequestError(f"temperature must be in [0, 100], got {params.temperature}")
    if not 0.0 < params.top_p <= 1.0:
        raise RequestError(f"top_p must be in (0, 1], got {params.top_p}")
    if params.top_k < -1:
        raise RequestError(f"top_k must be -1 (off), 0 (off) or positive, got {params.top_k}")
    if not 0.0 <= params.min_p <= 1.0:
        raise RequestError(f"min_p must be in [0, 1], got {params.min_p}")
    if not 0.0 < params.repetition_penalty <= 2.0:
        raise RequestError(f"repetition_penalty must be in (0, 2], got {params.repetition_penalty}")
    for name in ("frequency_penalty", "presence_penalty"):
        value = getattr(params, name)
        if not -2.0 <= value <= 2.0:
            raise RequestError(f"{name} must be in [-2, 2], got {value}")
    if not 0 <= params.min_tokens <= params.max_tokens:
        raise RequestError(f"min_tokens must be in [0, max_tokens = {params.max_tokens}], got {params.min_tokens}")
    if len(params.stop) > MAX_STOP_STRINGS:
        raise RequestError(f"stop has {len(params.stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
    for i, stop in enumerate(params.stop):
        if len(stop) > MAX_STOP_CHARS:
            raise RequestError(f"stop[{i}] is {len(stop)} characters long; at most {MAX_STOP_CHARS} are allowed")
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise RequestError(f"stop_token_ids has {len(params.stop_token_ids)} ids; at most {MAX_STOP_TOKEN_IDS} "
                           "are allowed")
    if len(params.logit_bias) > MAX_LOGIT_BIAS:
        raise RequestError(f"logit_bias has {len(params.logit_bias)} entries; at most {MAX_LOGIT_BIAS} are allowed")
    for t in params.stop_token_ids:
        if not 0 <= t < vocab:
            raise RequestError(f"stop_token_ids: {t} is outside the vocabulary of {vocab}")
    for t, bias in params.logit_bias:
        if not 0 <= t < vocab:
            raise RequestError(f"logit_bias: token {t} is outside the vocabulary of {vocab}")
        if not -100.0 <= bias <= 100.0:
            raise RequestError(f"logit_bias: the bias of token {t} must be in [-100, 100], got {bias}")
    if params.logprobs is not None and not 0 <= params.logprobs <= 20:
        raise RequestError(f"logprobs must be in [0, 20], got {params.logprobs}")
    if params.logprob_start_len != -1:
        if params.logprobs is None:
            raise RequestError("logprob_start_len needs log-probabilities to be asked for (return_logprob)")
        if not 0 <= params.logprob_start_len < len(prompt_ids):
            raise RequestError(f"logprob_start_len must be -1 or in [0, {len(prompt_ids) - 1}] (the prompt has "
                               f"{len(prompt_ids)} tokens), got {params.logprob_start_len}")
    if params.seed is not None and not -(2**63) <= params.seed < 2**64:
        raise RequestError(f"seed must fit in 64 bits, got {params.seed}")
