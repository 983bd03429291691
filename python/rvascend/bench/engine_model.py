"""The model the in-process engine benchmarks run (chunked_prefill, prefix_cache, long_output,
structured_output, deterministic): their shared flags and loading, and their decode-step timing."""

from __future__ import annotations

import time

import torch
from absl import flags

from rvascend.models.random_model import ensure_random_model
from rvascend.models.loader import load_model
from rvascend.models.decoder import CausalLM


def define_flags(policy: str) -> None:
    flags.DEFINE_string("model-path", None, "Checkpoint (default: the random-weight test model).")
    flags.DEFINE_integer("threads", None, "torch threads (default: torch's).")
    flags.DEFINE_enum("policy", policy, ["on", "off"], "RVV policy (eager routes).")


def load() -> tuple[str, CausalLM]:
    """(checkpoint path, model) as the flags ask, with torch's threads set."""
    flag_values = flags.FLAGS
    if flag_values.threads:
        torch.set_num_threads(flag_values.threads)
    path = flag_values["model-path"].value or ensure_random_model()
    model = load_model(path)
    if flag_values.policy == "on":
        from rvascend.policy import KernelPolicyConfig, install_kernel_policy

        install_kernel_policy(model, KernelPolicyConfig.from_flag(compile_mode="eager"))
    return path, model


def decode_step_seconds(engine, seqs: list) -> list[float]:
    """Steps `engine` until it is idle; the seconds of every step taken while each of `seqs`
    was decoding (their prompts and first tokens untimed)."""
    times = []
    while engine.has_work():
        decoding = all(s.output_ids for s in seqs)
        t0 = time.perf_counter()
        engine.step()
        if decoding:
            times.append(time.perf_counter() - t0)
    return times
