"""The CPU serving engine: checkpoint loading, tokenizer, KV pool, continuous-batching scheduler.

Owns the path from a request (prompt ids + sampling parameters) to generated
tokens: FCFS admission against a fixed KV pool, prefill and batched decode
steps (two running sequences make M = 2 in every Linear), sampling, stop
conditions, and the RVV policy installed when asked for.
"""

from rvascend.engine.engine import Engine, EngineConfig, QueueFullError, RequestError
from rvascend.engine.grammar import Grammar, GrammarError
from rvascend.engine.sequence import SamplingParams, Sequence

__all__ = ["Engine", "EngineConfig", "Grammar", "GrammarError", "QueueFullError", "RequestError", "SamplingParams",
           "Sequence"]
