"""Helpers the model tests share: whole-prompt logits, decode and step batches, a pool of
random K/V, a Runner that drives a model as the engine does, narrow random-weight
checkpoints (those the riscv64 image's checks run, tests/riscv64_image) and scripted
drafts (engine/testing.py has the helpers that need the engine or the policy)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile

import torch
from safetensors.torch import save_file

from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.state_pool import RecurrentStatePool
from rvascend.dispatch.fused_decoder import held_off
from rvascend.models import random_checkpoint
from rvascend.models.random_model import ensure_random_model, random_weights

# Llama at 1024 wide and Qwen3.5 (three Gated DeltaNet layers, then gated full attention)
# one period deep, with the real head dimensions (128) and 256 wide: every projection is
# packed (riscv64's gate is invariant) and emulation stays short (at 1024 wide, a Qwen3.5
# prompt of 18 tokens took 48 s under QEMU). No MTP head.
IMAGE_LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "intermediate_size": 1024,
               "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
               "vocab_size": 1024, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 256,
               "tie_word_embeddings": True, "eos_token_id": 1}
IMAGE_QWEN3_5 = dict(random_checkpoint.SHAPES["qwen3.5-0.8b"], hidden_size=256, intermediate_size=512,
                     num_hidden_layers=4, head_dim=128, linear_num_key_heads=4, linear_num_value_heads=8,
                     vocab_size=1024, max_position_embeddings=256, mtp_num_hidden_layers=0,
                     layer_types=random_checkpoint.SHAPES["qwen3.5-0.8b"]["layer_types"][:4])

# Qwen3.5's layer pattern (three Gated DeltaNet layers, then gated full attention), narrow:
# the engine's hybrid tests (prefix cache, cache tiers).
TINY_QWEN3_5 = dict(random_checkpoint.SHAPES["qwen3.5-0.8b"], hidden_size=128, intermediate_size=256,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                    linear_value_head_dim=32, vocab_size=512, max_position_embeddings=1024, mtp_num_hidden_layers=0,
                    layer_types=random_checkpoint.SHAPES["qwen3.5-0.8b"]["layer_types"][:4])


def all_logits(model: CausalLM, ids: torch.Tensor) -> torch.Tensor:
    """FP32 logits at every position of one prompt, from a fresh KV pool."""
    n = ids.shape[0]
    batch = ForwardBatch(ids, torch.arange(n), [n], [0], [torch.arange(n)], torch.arange(n))
    with torch.inference_mode():
        return model(batch, KVPool(model.config, n, next(model.parameters()).dtype), all_logits=True).float()


def decode_batch(contexts: list[int], vocab: int = 2048) -> ForwardBatch:
    """One new token per sequence; sequence i's slots are a disjoint range of the pool."""
    return step_batch([(n - 1, 1) for n in contexts], vocab, seed=sum(contexts))


def step_batch(chunks: list[tuple[int, int]], vocab: int = 2048, seed: int = 0) -> ForwardBatch:
    """(cached, new) tokens per sequence: a prefill (0, n), a chunk of a longer prompt, or a
    decode row (n - 1, 1); sequence i's slots are a disjoint range of the pool."""
    slots, start = [], 0
    for cached, new in chunks:
        slots.append(torch.arange(start, start + cached + new))
        start += cached + new + 3
    ids = torch.randint(0, vocab, (sum(new for _, new in chunks),), generator=torch.Generator().manual_seed(seed))
    positions = torch.cat([torch.arange(cached, cached + new) for cached, new in chunks])
    return ForwardBatch(ids, positions, [new for _, new in chunks], [cached for cached, _ in chunks], slots,
                        torch.cat([s[len(s) - new:] for s, (_, new) in zip(slots, chunks)]))


def random_pool(model: CausalLM, slots: int = 256) -> KVPool:
    """A BF16 KV pool of seeded random K/V."""
    pool = KVPool(model.config, slots, torch.bfloat16)
    g = torch.Generator().manual_seed(5)
    for k, v in zip(pool.k, pool.v):
        k.copy_(torch.randn(k.shape, generator=g))
        v.copy_(torch.randn(v.shape, generator=g))
    return pool


def decode_logits(model: CausalLM, batch: ForwardBatch, pool: KVPool, fused: bool) -> torch.Tensor:
    """A decode step's logits, through the policy's fused step or (fused=False) op by op."""
    with torch.inference_mode(), contextlib.nullcontext() if fused else held_off(model):
        return model(batch, pool)


class Runner:
    """Drives a model as the engine does (KV slots, recurrent state slots, chunked prefill,
    decode steps), without the engine's scheduler."""

    def __init__(self, model, sequences: int, chunk: int) -> None:
        self.model, self.chunk = model, chunk
        dtype = next(model.parameters()).dtype
        self.pool = KVPool(model.config, 1024, dtype)
        self.pool.states = RecurrentStatePool(model.config, 2 * sequences + 2, dtype)
        stale = torch.Generator().manual_seed(0)  # the same in every Runner
        for state in (*self.pool.states.conv, *self.pool.states.ssm):
            state.normal_(generator=stale)  # stale slots, as a freed slot holds: a prompt's first chunk must not read them
        self.slots: list[list[int]] = [[] for _ in range(sequences)]
        self.free = list(range(1024))
        # Two slots per sequence, as the engine keeps them: read one, write the other, swap.
        # Not 0..B-1: slots are looked up.
        self.state_slots = [2 * sequences + 1 - i for i in range(sequences)]
        self.next_state_slots = [sequences + 1 - i for i in range(sequences)]

    def step(self, rows: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """rows: (sequence, new tokens, tokens before them); logits of every new token."""
        ids, positions, kv, write = [], [], [], []
        for i, new, prefix in rows:
            fresh = [self.free.pop() for _ in new]
            ids += new
            positions += range(prefix, prefix + len(new))
            self.slots[i] += fresh
            kv.append(torch.tensor(self.slots[i]))
            write += fresh
        batch = ForwardBatch(torch.tensor(ids), torch.tensor(positions), [len(n) for _, n, _ in rows],
                             [p for _, _, p in rows], kv, torch.tensor(write),
                             state_slots=[self.next_state_slots[i] for i, _, _ in rows],
                             state_read_slots=[self.state_slots[i] for i, _, _ in rows])
        with torch.inference_mode():
            logits = self.model(batch, self.pool, all_logits=True)
        for i, _, _ in rows:
            self.state_slots[i], self.next_state_slots[i] = self.next_state_slots[i], self.state_slots[i]
        return logits


def tiny_qwen3_5_config(vocab_size: int, tie: bool):
    """A small Qwen3.5 text config that has every layer kind and fewer key than value
    heads in its Gated DeltaNet layers (the case that reorders value heads)."""
    import transformers

    return transformers.Qwen3_5TextConfig(
        vocab_size=vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
        linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=4,
        layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1]},
        max_position_embeddings=512, tie_word_embeddings=tie, architectures=["Qwen3_5ForCausalLM"])


def write_random_checkpoint(config: dict) -> str:
    """A fresh directory holding `config` and random weights (seed 0), no tokenizer."""
    path = tempfile.mkdtemp()
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    save_file(random_weights(config, seed=0), os.path.join(path, "model.safetensors"))
    return path


def wrong_in_most_steps(answer: list[int], done: int, k: int, vocab: int) -> list[int]:
    """A scripted draft: the k tokens of `answer` after its first `done`, with the one at
    done % (k + 2) changed when that falls inside, so that verify steps take all of a
    draft, part of it, or none."""
    draft = list(answer[done:done + k])
    wrong = done % (k + 2)
    if wrong < len(draft):
        draft[wrong] = (draft[wrong] + 1) % vocab
    return draft


MTP_FULL_LAYER = 2  # tiny_qwen3_5_config's full-attention layer: an MTP layer has its shapes


def write_qwen3_5_mtp_checkpoint(path: str, vocab_size: int, tie: bool):
    """A random FP32 Qwen3.5 (tiny_qwen3_5_config) with an MTP head saved into `path` as a
    checkpoint names it (mtp.*: one full-attention layer, the two pre-fc norms, fc and the
    head's final norm); (transformers' model, the MTP tensors)."""
    import transformers

    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(tiny_qwen3_5_config(vocab_size, tie=tie)).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.dim() == 1 else 0.2))
    hf.save_pretrained(path)
    generator, h = torch.Generator().manual_seed(1), hf.config.hidden_size

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=generator) * scale

    mtp = {f"mtp.layers.0.{name}": rand(*p.shape, scale=0.5 if p.dim() == 1 else 0.2)
           for name, p in hf.model.layers[MTP_FULL_LAYER].named_parameters()}
    mtp.update({"mtp.pre_fc_norm_embedding.weight": rand(h, scale=0.5), "mtp.pre_fc_norm_hidden.weight": rand(h, scale=0.5),
                "mtp.fc.weight": rand(h, 2 * h), "mtp.norm.weight": rand(h, scale=0.5)})
    save_file(mtp, os.path.join(path, "mtp.safetensors"))
    with open(os.path.join(path, "config.json")) as f:
        config = json.load(f)
    config["mtp_num_hidden_layers"] = 1
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(config, f)
    return hf, mtp


# Tiny random checkpoints of the dense families, written as GGUF (write_tiny_gguf).
_TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=2048, max_position_embeddings=512, initializer_range=0.05, rms_norm_eps=1e-5)
GGUF_FAMILIES = {
    "llama": lambda t: t.LlamaConfig(**_TINY, tie_word_embeddings=True, rope_theta=10000.0),
    "qwen2": lambda t: t.Qwen2Config(**_TINY, tie_word_embeddings=False, rope_theta=1000000.0),
    # head_dim 128: transformers reads no key_length from a qwen3 GGUF and takes its default.
    "qwen3": lambda t: t.Qwen3Config(**_TINY, head_dim=128, tie_word_embeddings=True),
}
_GGUF_MATRICES = ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# The file types llama.cpp's quantizer writes (llama_cpp.LLAMA_FTYPE_MOSTLY_<kind>).
LLAMA_CPP_FTYPES = ("Q4_K_M", "Q5_K_M", "Q3_K_M", "Q2_K", "Q6_K", "IQ4_XS", "IQ4_NL")


def write_tiny_gguf(family: str, kind: str, tmp) -> str:
    """A tiny random `family` checkpoint (seed 0, the test tokenizer) as a GGUF file in the
    directory `tmp` (a pathlib.Path): every matrix in `kind`, by the gguf package's
    quantizer, or by llama.cpp's for its file types (LLAMA_CPP_FTYPES); its path."""
    import gguf
    import transformers

    from rvascend.models import gguf_export
    from rvascend.testing import llama_cpp

    types = gguf.GGMLQuantizationType
    hf_dir = str(tmp / "hf")
    if not os.path.exists(hf_dir):
        torch.manual_seed(0)
        transformers.AutoModelForCausalLM.from_config(GGUF_FAMILIES[family](transformers)).save_pretrained(hf_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(os.path.join(ensure_random_model(), name), os.path.join(hf_dir, name))
    path = str(tmp / f"{kind}.gguf")
    if kind in LLAMA_CPP_FTYPES:
        f32 = str(tmp / "f32.gguf")
        if not os.path.exists(f32):
            gguf_export.export(hf_dir, f32, default_type=types.F32)
        llama_cpp.quantize(f32, path, kind)
    else:
        gguf_export.export(hf_dir, path, {role: types[kind] for role in _GGUF_MATRICES}, default_type=types.F32)
    return path
