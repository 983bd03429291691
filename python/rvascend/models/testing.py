"""Helpers the model tests share: whole-prompt logits, decode and step batches, a pool of
random K/V, a Runner that drives a model as the engine does, narrow random-weight
checkpoints (those the riscv64 image's checks run, tests/riscv64_image) and scripted
drafts (engine/testing.py has the helpers that need the engine or the policy)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile

import torch
from safetensors.torch import save_file

from rvascend.models.decoder import CausalLM, ForwardBatch, KVPool
from rvascend.models.state_pool import RecurrentStatePool
from rvascend.dispatch.fused_decoder import held_off
from rvascend.models import random_checkpoint
from rvascend.models.random_model import random_weights

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
