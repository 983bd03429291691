"""`serve`: an OpenAI-compatible server (flags follow SGLang's names).

  bazel run //python:serve -- [--model-path DIR|FILE.gguf] [--enable-cpu-kernels] [--port 30000]

Without --model-path it serves SmolLM2-135M-Instruct (models/default_model.py), converted
from its pinned GGUF into the cache at first use.
"""

from __future__ import annotations

import sys

import uvicorn
from absl import app, logging

from rvascend.server import limits, server_args
from rvascend.server.app import create_app
from rvascend.server.launch import build_engine, uvicorn_options

server_args.define_flags()


def main(argv: list[str]) -> int:
    del argv
    opts = server_args.from_flags()
    try:
        server_options = uvicorn_options(opts)
        engine, name, policy = build_engine(opts)
    except (ValueError, FileNotFoundError) as e:
        logging.error("%s", e)
        return 2
    name = opts.served_model_name or name
    logging.info("serving %s on http://%s:%d", name, opts.host, opts.port)
    info = {"model_path": opts.model_path, "served_model_name": name, "dtype": opts.dtype,
            "device": opts.device, "attention_backend": opts.attention_backend,
            "enable_cpu_kernels": policy is not None,
            "enable_deterministic_inference": policy is not None and policy.config.deterministic,
            "max_running_requests": opts.max_running_requests,
            "max_total_tokens": engine.config.max_total_tokens}
    app_ = create_app(engine, name, policy, limits.resolve_api_key(opts.api_key), opts.watchdog_timeout, info,
                      limits.allowed_hosts(opts.host, opts.allowed_hosts),
                      tool_call_parser=opts.tool_call_parser, reasoning_parser=opts.reasoning_parser)
    uvicorn.run(app_, host=opts.host, port=opts.port, **server_options)
    return 0


if __name__ == "__main__":
    sys.exit(app.run(main))
