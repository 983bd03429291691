"""The OpenAI-compatible HTTP server over the engine.

Owns the request schemas and their validation, the completions and chat
endpoints (streaming too), /v1/models, /health, Prometheus /metrics, the
engine thread, and the SGLang-named command-line flags of `serve`.
"""
