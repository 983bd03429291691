"""GGUF files of every kept type served from their quantized weights, against
implementations no one here wrote.

- Llama, Qwen2 and Qwen3 tiny random checkpoints, written as GGUF with every matrix
  in Q8_0, Q4_0, Q4_1, Q5_0 or Q5_1 (the gguf package's quantizer), and as the files
  people download, written by llama.cpp's own quantizer (llama_model_quantize):
  Q4_K_M, Q5_K_M, Q3_K_M, Q2_K, Q6_K, IQ4_XS and IQ4_NL: the
  modules keep each tensor's type, and the logits agree with transformers' FP32
  model on the same file (the gguf package's dequantization + FP32 F.linear)
  within the error of quantizing the activations alone (stated below).
- SmolLM2-135M Q4_1 (the default model): greedy tokens equal llama.cpp's
  (llama-cpp-python on the same file) over 16 prompts x 32 tokens, but where
  llama.cpp's own top-2 margin is a near tie; perplexity within 1 % of llama.cpp's
  on the same text (the GPL-3 that Debian's base-files ships).
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess

import gguf
import numpy as np
import pytest
import torch
import transformers

from rvascend.testing.rss import fresh_process_json
from rvascend.testing import llama_cpp
from rvascend.engine import Engine, EngineConfig, SamplingParams
from rvascend.models import default_model
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models import gguf_checkpoint
from rvascend.models.loader import load_model
from rvascend.models.quantized_layers import QuantizedEmbedding, quantized_modules
from rvascend.models.testing import (GGUF_FAMILIES, LLAMA_CPP_FTYPES, all_logits, decode_batch, decode_logits,
                                     random_pool, write_tiny_gguf)
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy
from rvascend.dispatch.fused_decoder import FUSED_ATTR

PROMPT = torch.randint(0, 2048, (24,), generator=torch.Generator().manual_seed(3))



@pytest.mark.parametrize("family", sorted(GGUF_FAMILIES))
@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", *LLAMA_CPP_FTYPES])
def test_kept_quantized_matches_transformers_on_the_same_file(family, kind, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"{family}-{kind}")
    path = write_tiny_gguf(family, kind, tmp)
    reader = gguf.GGUFReader(path)
    want_types = {t.name: t.tensor_type.name for t in reader.tensors if len(t.shape) == 2}
    model = load_model(path, torch.bfloat16, keep_quantized=True)
    kept = {p.fmt for _, m in quantized_modules(model) for p in m.parts}
    assert kept == set(want_types.values()) - {"F32", "F16", "BF16"}, (kept, want_types)
    assert not any(p.dim() == 2 for p in model.parameters())  # no dequantized copy of any matrix
    if family != "qwen2":  # tied: one quantized table serves the lookup and the logits
        assert isinstance(model.model.embed_tokens, QuantizedEmbedding) and model.lm_head is model.model.embed_tokens
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager"))
    got = all_logits(model, PROMPT)
    assert get_policy(model).counters.calls(route="fallback") == 0
    directory, name = os.path.split(path)
    ref_model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                                  dtype=torch.float32).eval()
    with torch.no_grad():
        want = ref_model(PROMPT[None]).logits[0].float()
    # The bound: the activations are quantized per 32 (or 256) values to int8 (an error of
    # at most half a step, amax / 254, about 0.4 % of a block's largest value) and kept in
    # BF16 between layers (2^-9 relative); through two layers of a model of width 256 this
    # moves a logit by about 3-4 % of the largest (the transformers model computes the
    # same dequantized weights in FP32 with FP32 activations; measured on qwen3: Q3_K_M
    # 2.9 %, Q4_K_M 3.5 %, Q2_K 4.1 %, and 0.0 % with the same file dequantized to FP32, so
    # all of it is the activations'). A wrong scale or bit plane moves logits by far more.
    assert (got - want).abs().max().item() <= 0.05 * want.abs().max().item()
    # And the ranking agrees wherever the reference is not close to a tie.
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * want.abs().max()
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_a_corrupt_scale_is_named_with_its_file_and_tensor(tmp_path, caplog):
    """A NaN scale in a kept tensor is refused naming the file and the GGUF tensor (the row
    the native check names is the fused part's); a type the engine does not keep is logged
    with what dequantizing it costs."""
    path = write_tiny_gguf("llama", "Q5_1", tmp_path)
    info = gguf_checkpoint.GgufCheckpoint(path)
    offset = info._tensors["blk.1.attn_k.weight"].offset
    info.close()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(np.array([0x7E00], dtype="<u2").tobytes())  # block 0's d: NaN
    with pytest.raises(gguf_checkpoint.GgufError, match=r"Q5_1\.gguf: blk\.1\.attn_q\.weight \+ "
                       r"blk\.1\.attn_k\.weight \+ blk\.1\.attn_v\.weight: Q5_1 weight row \d+, block 0 has a NaN"):
        load_model(path, torch.bfloat16, keep_quantized=True)
    with caplog.at_level(logging.INFO):
        load_model(write_tiny_gguf("llama", "Q8_0", tmp_path), torch.bfloat16, keep_quantized=False)
    assert any(re.fullmatch(r"15 Q8_0 tensors dequantized to bfloat16: [\d.]+ MiB in the file, [\d.]+ MiB in memory "
                            r"\(1\.9x\)", r.getMessage()) for r in caplog.records), [r.getMessage() for r in caplog.records]


def test_the_fused_step_reads_a_replaced_quantized_weight_or_norm(tmp_path):
    """The fused decode step keeps its native model between steps: a part
    replaced through set_part, or a new norm weight, reaches the very next step."""
    model = load_model(write_tiny_gguf("llama", "Q8_0", tmp_path), keep_quantized=True)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed"))
    kernels = get_policy(model).kernels.counters
    batch, pool = decode_batch([30]), random_pool(model)  # one pool: the plan is kept
    fresh = decode_logits(model, batch, pool, fused=True)
    assert torch.equal(decode_logits(model, batch, pool, fused=True), fresh)
    assert kernels.calls("decoder_layers", "kernel") == 2
    first, second = model.model.layers[0].mlp.down_proj, model.model.layers[1].mlp.down_proj
    a, b = first.qweight(0), second.qweight(0)
    first.set_part(0, b.clone())
    second.set_part(0, a.clone())
    swapped = decode_logits(model, batch, pool, fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 3
    assert not torch.equal(swapped, fresh)
    assert torch.equal(swapped, decode_logits(model, batch, pool, fused=False))
    norm = model.model.layers[1].post_attention_layernorm
    norm.weight = torch.nn.Parameter(norm.weight.detach() * 2)
    scaled = decode_logits(model, batch, pool, fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 4
    assert not torch.equal(scaled, swapped)
    assert torch.equal(scaled, decode_logits(model, batch, pool, fused=False))
    # The logits come out of the same call, from the head's quantized bytes; new bytes reach
    # the next step there too.
    assert model.__dict__[FUSED_ATTR]._plan.head.parts  # the head is quantized
    head = model.lm_head
    head.set_part(0, torch.zeros_like(head.qweight(0)))  # every scale 0: every logit 0
    zeroed = decode_logits(model, batch, pool, fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 5
    assert not torch.equal(zeroed, scaled) and torch.equal(zeroed, decode_logits(model, batch, pool, fused=False))


_LLAMA_GUEST = r"""
import json, sys
import numpy as np
import llama_cpp
path, prompts, n_new, ppl_tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
llm = llama_cpp.Llama(model_path=path, n_ctx=1024, logits_all=True, verbose=False, n_threads=2, seed=0)
out = []
for ids in prompts:
    llm.reset()
    llm.eval(ids)
    tokens = []
    for _ in range(n_new):
        tokens.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([tokens[-1]])
    out.append({"tokens": tokens})
llm.reset()
llm.eval(ppl_tokens)
scores = np.array(llm.scores[:len(ppl_tokens)], dtype=np.float64)
lse = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
nll = float(np.mean(lse[:-1] - scores[np.arange(len(ppl_tokens) - 1), ppl_tokens[1:]]))
print(json.dumps({"greedy": out, "nll": nll}))
"""

QUESTIONS = ["What is the capital of France? Answer in one sentence.", "Write a haiku about the sea.",
             "How do I reverse a list in Python?", "Count from 1 to 10.", "Name three primary colours.",
             "What is 12 times 12?", "Translate 'good morning' into Spanish.", "Who wrote Hamlet?",
             "Give me a synonym for happy.", "What is the boiling point of water?",
             "Explain photosynthesis in one sentence.", "List the days of the week.",
             "What is the largest ocean?", "Tell me a short joke.", "What does CPU stand for?",
             "Describe a cat in five words."]
# Where the exact product's two best logits (FP32 over the file's dequantized weights) are
# closer than this, either choice is right. Neither engine computes it: on these prompts this
# engine's gap between those two tokens is off by 0.12 at the median, 0.79 at the 99th
# percentile (BF16 activations and logits), and llama.cpp's own gaps are off too (at one
# position 0.88 where the exact gap was 0.22), and move with the host's kernels. Measured over
# 512 positions: every choice where either engine left the exact argmax had an exact gap
# under 0.24.
NEAR_TIE = 0.75


def test_the_peer_is_built_without_amx():
    """The peer's AMX buffer type segfaulted on the default model's Q4_1 tensors on an Intel
    host with AMX (the whole comparison below died with it): the build leaves AMX out on every
    host (setup/llama_cpp.NO_AMX_FLAGS). On a host without AMX this holds either way."""
    done = subprocess.run([llama_cpp.python_path(), "-c", "import llama_cpp; "
                           "print(llama_cpp.llama_print_system_info().decode())"],
                          capture_output=True, text=True, check=True, timeout=300)
    assert "CPU" in done.stdout and "AMX_INT8 = 1" not in done.stdout, done.stdout


def test_default_model_greedy_and_perplexity_match_llama_cpp():
    path = default_model.ensure_default_model()
    tok = Tokenizer(path)
    prompts = [tok.encode(tok.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        text = f.read()
    ppl_ids = tok.encode(text)[:1024]
    done = subprocess.run([llama_cpp.python_path(), "-c", _LLAMA_GUEST, path, json.dumps(prompts), "32",
                           json.dumps(ppl_ids)], capture_output=True, text=True, check=True, timeout=900)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    model = load_model(path, torch.bfloat16, keep_quantized=True)
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager"))
    engine = Engine(model, tok, EngineConfig(max_total_tokens=4096, max_running_requests=16))
    seqs = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    exact_model = load_model(path, torch.float32, keep_quantized=False)
    with torch.no_grad():
        exact = [all_logits(exact_model, torch.tensor(prompt + ref["tokens"]))[len(prompt) - 1:-1].topk(2)
                 for prompt, ref in zip(prompts, theirs["greedy"])]
    del exact_model
    exact_gaps = [(top.values[:, 0] - top.values[:, 1]).tolist() for top in exact]
    identical, tie_parted, mismatches = 0, 0, []
    for seq, ref, gaps in zip(seqs, theirs["greedy"], exact_gaps):
        ours = seq.output_ids
        first = next((i for i, (a, b) in enumerate(zip(ours, ref["tokens"])) if a != b), None)
        if first is None:
            identical += 1
        elif gaps[first] < NEAR_TIE:  # the texts agree up to `first`: the exact gaps there hold for both
            tie_parted += 1
        else:
            mismatches.append((first, ours[first], ref["tokens"][first], gaps[first]))
    # Past a parting the two continue different texts; teacher-forced on llama.cpp's own
    # continuation, every clear choice (exact gap >= NEAR_TIE) must be the same in both.
    clear, agreed, peer_off = 0, 0, 0
    for prompt, ref, gaps, top in zip(prompts, theirs["greedy"], exact_gaps, exact):
        logits = all_logits(model, torch.tensor(prompt + ref["tokens"]))[len(prompt) - 1:-1]
        for row, token, gap, best in zip(logits, ref["tokens"], gaps, top.indices[:, 0].tolist()):
            if gap >= NEAR_TIE:
                clear += 1
                agreed += int(row.argmax()) == token
                peer_off += token != best
    print(f"greedy: {identical} of {len(prompts)} identical for 32 tokens, {tie_parted} parted at a near tie, "
          f"{len(mismatches)} elsewhere; teacher-forced: {agreed} of {clear} clear choices agree "
          f"({peer_off} where llama.cpp left the exact argmax)")
    assert not mismatches, mismatches
    assert agreed == clear
    logits = all_logits(model, torch.tensor(ppl_ids)).double()
    ids = torch.tensor(ppl_ids)
    nll = (torch.logsumexp(logits[:-1], -1) - logits[:-1].gather(1, ids[1:, None])[:, 0]).mean().item()
    ours_ppl, theirs_ppl = float(np.exp(nll)), float(np.exp(theirs["nll"]))
    print(f"perplexity over {len(ppl_ids)} tokens of GPL-3: ours {ours_ppl:.3f}, llama.cpp {theirs_ppl:.3f}")
    assert abs(ours_ppl / theirs_ppl - 1) <= 0.01


@pytest.fixture(scope="module")
def requantized(tmp_path_factory):
    """recipe -> the default model written into it by llama.cpp's quantizer, once per module
    (IQ4_XS's search costs about a minute)."""
    files: dict[str, str] = {}

    def get(kind: str) -> str:
        if kind not in files:
            files[kind] = llama_cpp.quantize(default_model.ensure_default_model(),
                                             str(tmp_path_factory.mktemp("requantized") / f"{kind}.gguf"), kind)
        return files[kind]
    return get


@pytest.mark.parametrize("kind", ["Q5_K_M", "Q3_K_M", "Q2_K", "IQ4_XS", "Q4_K_M"])
def test_default_model_requantized_perplexity_matches_llama_cpp(kind, requantized):
    """The default model written by llama.cpp's quantizer into each recipe people download
    (from its Q4_1 file: SmolLM2's 576-wide matrices are not whole super-blocks, so the
    recipes fall back to Q5_0, Q5_1, IQ4_NL and Q8_0 there, K-quants elsewhere): perplexity
    through this engine within 1.5 % of llama.cpp's on the same file and text. Measured over
    these 1024 tokens on an AVX-512 VNNI host, ours / llama.cpp: Q5_K_M 1.0077, Q3_K_M
    1.0058, Q2_K 0.9937, IQ4_XS 1.0090, Q4_K_M 0.9999 (with FP32 activations 0.9971, 0.9966,
    1.0010, 1.0072, 1.0087). Neither engine is the exact product: against transformers' FP32
    model on the same dequantized weights, llama.cpp is off by +0.3 % (Q4_K_M), +0.5 % (IQ4_XS)
    and +1.3 % (Q5_K_M), this engine with FP32 activations by +1.2, +1.2 and +1.0 %: both
    quantize the activations to int8, so their difference can reach the sum of the two, and
    llama.cpp runs other kernels on other hosts. A format read wrongly moves perplexity by far
    more."""
    source = default_model.ensure_default_model()
    path = requantized(kind)
    with open("/usr/share/common-licenses/GPL-3", encoding="utf-8") as f:
        ppl_ids = Tokenizer(source).encode(f.read())[:1024]
    done = subprocess.run([llama_cpp.python_path(), "-c", _LLAMA_GUEST, path, "[]", "0", json.dumps(ppl_ids)],
                          capture_output=True, text=True, check=True, timeout=900)
    theirs = json.loads(done.stdout.strip().splitlines()[-1])["nll"]
    model = load_model(path, torch.bfloat16, keep_quantized=True)
    kept = {p.fmt for _, m in quantized_modules(model) for p in m.parts}
    assert not any(p.dim() == 2 for p in model.parameters()), kept  # every matrix stayed quantized
    install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager"))
    logits = all_logits(model, torch.tensor(ppl_ids)).double()
    ids = torch.tensor(ppl_ids)
    ours = (torch.logsumexp(logits[:-1], -1) - logits[:-1].gather(1, ids[1:, None])[:, 0]).mean().item()
    print(f"{kind} ({', '.join(sorted(kept))}): perplexity ours {np.exp(ours):.3f}, llama.cpp {np.exp(theirs):.3f}")
    assert abs(np.exp(ours - theirs) - 1) <= 0.015


_MEMORY_GUEST = r"""
import json, sys, psutil, torch
from rvascend.models.loader import load_model
from rvascend.models.quantized_layers import quantized_modules
proc = psutil.Process()
base = proc.memory_info().rss
model = load_model(sys.argv[1], torch.bfloat16, keep_quantized=sys.argv[2] == "1")
after = proc.memory_info().rss
# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork + exec, so a child of a large
# test process would report its parent's peak; the new address space's high-water mark is its own.
peak = next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith("VmHWM:"))
packed = sum(m.packed_bytes for _, m in quantized_modules(model))
dense = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"base": base, "after": after, "peak": peak, "packed": packed, "dense": dense}))
"""


@pytest.mark.parametrize("recipe", [None, "Q5_K_M", "IQ4_XS"])
def test_default_model_memory_holds_the_quantized_weights_once(recipe, requantized):
    """RSS after loading the default model kept quantized (its own Q4_1 file, and requantized
    by llama.cpp into Q5_K_M and IQ4_XS): its quantized weights once (no dequantized copy,
    the file's pages released as each tensor is repacked), at most 1.2x the file's bytes."""
    path = requantized(recipe) if recipe else default_model.ensure_default_model()
    size = os.path.getsize(path)
    runs = {keep: fresh_process_json(_MEMORY_GUEST, path, keep) for keep in ("1", "0")}
    q, d = runs["1"], runs["0"]
    mib = 2 ** 20
    print(f"GGUF {size / mib:.0f} MiB; kept quantized: {q['packed'] / mib:.0f} MiB packed + {q['dense'] / mib:.1f} "
          f"MiB dense, RSS +{(q['after'] - q['base']) / mib:.0f} MiB (peak +{(q['peak'] - q['base']) / mib:.0f}); "
          f"dequantized to BF16: RSS +{(d['after'] - d['base']) / mib:.0f} MiB")
    assert q["packed"] <= 1.05 * size  # the runtime layout is the file's size (Q4_K: +3 %)
    assert q["after"] - q["base"] <= 1.2 * size
    # Once: what was made (packed + dense) plus 32 MiB of allocator and bookkeeping.
    assert q["after"] - q["base"] <= q["packed"] + q["dense"] + 32 * mib
    # At its peak (the metadata's Python objects, a tensor being repacked) never the whole
    # file resident beside the repacked weights.
    assert q["peak"] - q["base"] <= q["packed"] + q["dense"] + 0.8 * size
    assert d["after"] - d["base"] > 2 * (q["after"] - q["base"])  # the BF16 model is the big one
    # Dequantized, the peak is the model plus one tensor in flight: converted a slab of rows
    # at a time, never an FP32 copy of a whole tensor (1.59 x the BF16 model now, 1.71 when
    # the embedding went through FP32 whole; for Qwen3-0.6B Q8_0: 1.48 against 1.81).
    assert d["peak"] - d["base"] <= 1.65 * d["dense"]
