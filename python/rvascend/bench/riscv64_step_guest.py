"""Runs inside the riscv64 image (its python3.13 + torch 2.6) under QEMU for riscv64_step.py.

Builds the project's own model and engine on a checkpoint, sets up M running
sequences at context C without a prefill (their KV pool slots are filled with
random values: counts do not depend on them), and runs decode steps between
calls of the extension's count marker, which the TCG plugin turns into
intervals. A "verifyK" step is a decode step whose sequences each verify K draft
tokens (speculative decoding); "nextnK" the same with the checkpoint's MTP head
drafting for the next step inside it (region mtp_draft), "nextnKhN" with the head
drafting among the first N token ids only (a draft vocabulary). For each configuration: a warm-up step, one step marked only at
its ends (the total), and one step with a marker at every region boundary
(the breakdown; its extra cost, the markers themselves, is total_marked -
total). Prints one JSON line per measured step ("STEP {...}") and the guest's
executable mappings at the end ("MAPS [...]").
"""

from __future__ import annotations

import contextlib
import json
import sys

import torch

torch.set_num_threads(1)

from rvascend import ops  # noqa: E402
from rvascend.bench.step_kinds import draft_tokens, draft_vocab, turn_tokens  # noqa: E402
from rvascend.engine import Engine, EngineConfig, SamplingParams, mtp_draft, sampler  # noqa: E402
from rvascend.engine.model_runner import ModelRunner  # noqa: E402
from rvascend.engine.ngram_draft import DraftBudget  # noqa: E402
from rvascend.engine.sequence import Sequence, Status  # noqa: E402
from rvascend.models import decoder, layers  # noqa: E402
from rvascend.models import qwen3_5_mtp  # noqa: E402
from rvascend.models.loader import load_model  # noqa: E402
from rvascend.ops.packed_linear import _native  # noqa: E402
from rvascend.policy import KernelPolicyConfig, install_kernel_policy  # noqa: E402
from rvascend.dispatch import fused_decoder  # noqa: E402
from rvascend.dispatch.fused_decoder import FusedDecoder  # noqa: E402

_marks = 0


def mark() -> int:
    global _marks
    _native.count_marker(_marks)
    _marks += 1
    return _marks - 1


class Regions:
    """A marker at every region entry and exit; names[i] is the region of the
    interval that starts at this step's i-th marker (the innermost open one)."""

    def __init__(self) -> None:
        self.stack = ["engine"]
        self.names: list[str] = []
        self.active = False

    def enter(self, name: str) -> None:
        if self.active:
            mark()
            self.stack.append(name)
            self.names.append(name)

    def exit(self) -> None:
        if self.active:
            mark()
            self.stack.pop()
            self.names.append(self.stack[-1])

    def wrap(self, fn, name):
        def wrapped(*a, **k):
            self.enter(name)
            try:
                return fn(*a, **k)
            finally:
                self.exit()
        return wrapped

    def hook(self, module: torch.nn.Module, name: str) -> None:
        module.register_forward_pre_hook(lambda m, a: self.enter(name))
        module.register_forward_hook(lambda m, a, o: self.exit())


def instrument(model: torch.nn.Module, regions: Regions) -> None:
    for layer in model.model.layers:
        regions.hook(layer, "layer_glue")
        regions.hook(layer.input_layernorm, "rms_norm")
        regions.hook(layer.post_attention_layernorm, "rms_norm")
        if getattr(layer, "kind", "full_attention") == "linear_attention":  # Qwen3.5's Gated DeltaNet
            regions.hook(layer.linear_attn, "deltanet")
            regions.hook(layer.linear_attn.in_proj, "in_proj")
            regions.hook(layer.linear_attn.out_proj, "out_proj")
            regions.hook(layer.linear_attn.norm, "deltanet_norm")
        else:
            attn = layer.self_attn
            if type(attn) is not decoder.Attention:  # Qwen3.5's gated attention: norms, partial RoPE, gate
                regions.hook(attn, "attention")
            regions.hook(attn.qkv_proj, "qkv_proj")
            regions.hook(attn.o_proj, "o_proj")
            for norm in (attn.q_norm, attn.k_norm):
                if norm is not None:
                    regions.hook(norm, "qk_norm")
        regions.hook(layer.mlp, "mlp_glue")
        regions.hook(layer.mlp.act, "silu_mul")
        regions.hook(layer.mlp.gate_up_proj, "gate_up_proj")
        regions.hook(layer.mlp.down_proj, "down_proj")
    regions.hook(model.model.embed_tokens, "embedding")
    regions.hook(model.model.norm, "rms_norm")
    regions.hook(model.rotary, "rotary")
    regions.hook(model, "model_glue")
    decoder.apply_rotary = regions.wrap(decoder.apply_rotary, "rotary")
    # The attention module's own work on either side of its projections.
    decoder.Attention.project = regions.wrap(decoder.Attention.project, "attention")
    decoder.Attention.attend = regions.wrap(decoder.Attention.attend, "attention")
    decoder.projection_linear = regions.wrap(decoder.projection_linear, "lm_head")
    ops.elementwise.rope = regions.wrap(ops.elementwise.rope, "qk_norm_rope")
    # The residual add and the norm after it, fused or not.
    layers.RMSNorm.add_forward = regions.wrap(layers.RMSNorm.add_forward, "rms_norm")
    sampler.sample = regions.wrap(sampler.sample, "sampling")
    ModelRunner.greedy_tokens = regions.wrap(ModelRunner.greedy_tokens, "sampling")
    mtp_draft.draft = regions.wrap(mtp_draft.draft, "mtp_draft")
    instrument_fused_decoder(regions)


def instrument_fused_decoder(regions: Regions) -> None:
    """The fused decode step marks its own stages from C++ (one interval per stage
    and layer, then one back to the Python around it); their names come after."""
    stages = {kind: list(_native.decoder_stage_names(kind)) for kind in fused_decoder.PROJECTIONS}
    call = FusedDecoder.__call__

    def wrapped(self, *args):
        if not regions.active:
            return call(self, *args)
        regions.enter("decoder_glue")
        self.stage_markers = True
        try:
            out = call(self, *args)
        finally:
            self.stage_markers = False
        if out is not None:
            # After the layers, the model's final add + norm, the logits when the call made
            # them, then back to Python.
            names = [name for kind in self.kinds for name in stages[kind]] + ["rms_norm"] + \
                (["lm_head"] if out[1] is not None else []) + ["decoder_glue"]
            regions.names.extend(names)
            global _marks
            _marks += len(names)  # the markers the C++ side placed
        regions.exit()
        return out
    FusedDecoder.__call__ = wrapped


def decode_ready(engine: Engine, context: int, rows: int, vocab: int) -> list[Sequence]:
    """`rows` running sequences whose next step is the decode of token `context`."""
    gen = torch.Generator().manual_seed(0)
    seqs = []
    for _ in range(rows):
        ids = torch.randint(0, vocab, (context,), generator=gen).tolist()
        seq = Sequence(ids[:-1], SamplingParams(max_tokens=64, temperature=0, ignore_eos=True))
        seq.output_ids = [ids[-1]]
        seq.status = Status.RUNNING
        seq.slots = [engine.scheduler.free_slots.pop() for _ in range(context - 1)]
        seq.prefilled = len(seq.prompt_ids)
        engine.scheduler.take_state_slots(seq)  # a hybrid model's recurrent-state slots (contents: whatever)
        seq.reserved = seq.reservation
        engine.scheduler.reserved += seq.reserved
        engine.scheduler.running.append(seq)
        seqs.append(seq)
    return seqs


def prefill_ready(engine: Engine, prompt_len: int, rows: int, vocab: int) -> None:
    """`rows` requests whose next step prefills their whole `prompt_len`-token prompts."""
    gen = torch.Generator().manual_seed(prompt_len)
    for _ in range(rows):
        ids = torch.randint(0, vocab, (prompt_len,), generator=gen).tolist()
        engine.add_request(ids, SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))


def turn_ready(engine: Engine, context: int, rows: int, vocab: int, new: int) -> None:
    """`rows` requests whose next step prefills `new` prompt tokens after `context` ones the
    prefix cache held (their K/V slots and recurrent states already in place: resuming from
    a snapshot reads it where it is, no copy), as a chat's next turn does."""
    gen = torch.Generator().manual_seed(context)
    for _ in range(rows):
        seq = Sequence(torch.randint(0, vocab, (context + new,), generator=gen).tolist(),
                       SamplingParams(max_tokens=1, temperature=0, ignore_eos=True))
        seq.status = Status.RUNNING
        seq.slots = [engine.scheduler.free_slots.pop() for _ in range(context)]
        seq.prefilled = seq.cached_tokens = context
        engine.scheduler.take_state_slots(seq)
        seq.reserved = seq.reservation
        engine.scheduler.reserved += seq.reserved
        engine.scheduler.running.append(seq)


def step_setup(engine: Engine, kind: str, context: int, rows: int, vocab: int):
    """(ready, undo): what puts the engine one step before the step of this kind, and what
    takes it back, so that every counted step runs from the same state."""
    new = turn_tokens(kind)

    def run_out() -> None:
        while engine.has_work():
            engine.step()
    if new:
        return (lambda: turn_ready(engine, context, rows, vocab, new)), run_out
    if kind == "prefill":  # `rows` prompts of `context` tokens prefilled, their first tokens sampled
        return (lambda: prefill_ready(engine, context, rows, vocab)), run_out
    seqs = decode_ready(engine, context, rows, vocab)
    return (lambda: None), (lambda: rewind(engine, seqs, context))


def rewind(engine: Engine, seqs: list[Sequence], context: int) -> None:
    """Undoes one decode step (every token it emitted), so every measured step runs at the
    same context."""
    for seq in seqs:
        while seq.num_tokens > context:
            seq.output_ids.pop()
            engine.scheduler.free_slots.append(seq.slots.pop())
            seq.token_times.pop()
        seq.finish_reason = None
        seq.status = Status.RUNNING
        if seq not in engine.scheduler.running:
            engine.scheduler.running.append(seq)


def main() -> int:
    args = json.loads(sys.argv[1])
    kinds = [c[2] for c in args["configs"] if len(c) > 2]
    model = load_model(args["checkpoint"], torch.bfloat16, keep_quantized=args.get("keep_quantized", False),
                       mtp=any(k.startswith("nextn") for k in kinds))
    hot = {draft_vocab(k) for k in kinds} - {0}
    if len(hot) > 1:
        raise ValueError(f"one draft vocabulary per run, got {sorted(hot)}")
    if hot:  # before the policy, which packs the subset's projection
        qwen3_5_mtp.restrict_draft_vocab(model, list(range(hot.pop())))
    mode = args["mode"]  # off | linear | op_by_op | full
    if mode != "off":
        install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", kernels=(mode in ("full", "op_by_op")),
                                                  memory_budget_mib=1 << 20))
    if mode == "op_by_op":
        fused_decoder.detach(model)
    regions = Regions()
    instrument(model, regions)
    vocab = model.config.vocab_size
    for config in args["configs"]:
        context, rows = config[0], config[1]
        kind = config[2] if len(config) > 2 else "decode"
        drafts, new = draft_tokens(kind), turn_tokens(kind)
        algorithm = ("NEXTN" if kind.startswith("nextn") else "NGRAM") if drafts else None
        engine = Engine(model, None, EngineConfig(max_running_requests=rows,
                                                  max_total_tokens=rows * (context + new + 4 + 2 * drafts),
                                                  max_queued_requests=rows + 1,
                                                  context_length=context + new + 4 + drafts,
                                                  disable_radix_cache=True, chunked_prefill_size=-1,
                                                  speculative_algorithm=algorithm,
                                                  speculative_step_costs="none",  # the drafts are fixed below
                                                  speculative_num_draft_tokens=max(drafts, 1)))
        if drafts:
            # Drafts of random tokens: the target rejects them (the verify step's work does not
            # depend on acceptance; the head's extend pass then covers one position).
            fixed = torch.randint(0, vocab, (drafts,), generator=torch.Generator().manual_seed(1)).tolist()

            def draft(seq, fixed=fixed):
                seq.draft_budget = seq.draft_budget or DraftBudget(len(fixed))
                seq.draft = list(fixed)
                return seq.draft
            engine.speculator.draft_step = lambda decoding, *_: [draft(seq) for seq in decoding]
        with torch.no_grad():
            for k, v in zip(engine.pool.k, engine.pool.v):
                k.normal_()
                v.normal_()
        ready, undo = step_setup(engine, kind, context, rows, vocab)
        ready()
        engine.step()  # warm-up: first-call work, allocator growth
        undo()
        ready()
        first = mark()
        engine.step()
        mark()
        undo()
        ready()
        regions.names, regions.active = [], True
        start = mark()
        engine.step()
        regions.active = False
        end = mark()
        undo()
        print("STEP " + json.dumps({"context": context, "rows": rows, "kind": kind, "mode": mode,
                                    "total_interval": first + 1, "marked_first_interval": start + 1,
                                    "marked_last_interval": end, "regions": ["engine"] + regions.names}), flush=True)
    maps = [line.split() for line in open("/proc/self/maps") if "r-xp" in line]
    print("MAPS " + json.dumps([(m[0], m[5]) for m in maps if len(m) > 5]), flush=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
