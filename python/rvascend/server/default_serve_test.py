"""`python -m rvascend.server` with no arguments serves SmolLM2-135M-Instruct and answers
correctly; with the RVV policy on, its start-up log and route counters say the policy packs
none of the model's Linears (576 wide: under the shape gate)."""

from __future__ import annotations

import os
import subprocess
import sys

import openai
import pytest

from rvascend.models import default_model
from rvascend.server.loopback import free_port, wait_healthy
from rvascend.server.testing import Server


def test_no_arguments_serves_the_default_and_answers(tmp_path):
    port = free_port()
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RVASCEND_CACHE_DIR": str(tmp_path / "cache")}
    # --port only because 30000 may be taken on a test machine; nothing else.
    proc = subprocess.Popen([sys.executable, "-m", "rvascend.server", f"--port={port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log, "w"))
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, 300, lambda: log.read_text()[-3000:])
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
        reply = client.chat.completions.create(
            model="SmolLM2-135M-Instruct", max_tokens=32, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France?"}])
        assert "Paris" in reply.choices[0].message.content, reply
        assert reply.choices[0].finish_reason == "stop"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert "SmolLM2-135M-Instruct (its GGUF, from the wheel)" in log.read_text()


def test_policy_serves_the_default_quantized_and_metrics_show_it():
    """With the policy on, the default model's projections stay quantized (Q4_1, the
    tied Q8_0 embedding as lm_head) and every call takes the quantized kernels."""
    server = Server(model_path=default_model.ensure_default_model())
    try:
        assert server.policy is not None and len(server.policy.report.packed) == 4 * 30 + 1
        reply = server.client.chat.completions.create(
            model=server.name, max_tokens=16, temperature=0,
            messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
        assert "Paris" in reply.choices[0].message.content
        metrics = server.http.get("/metrics").text
        routes = [line for line in metrics.splitlines() if line.startswith("rvascend_projection_calls_total")]
        assert routes and all('route="packed"' in line for line in routes), routes
        kernels = [line for line in metrics.splitlines() if line.startswith("rvascend_kernel_calls_total")
                   and 'kernel="decoder_layers"' in line]
        assert any('route="kernel"' in line and not line.endswith(" 0.0") for line in kernels), kernels
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
