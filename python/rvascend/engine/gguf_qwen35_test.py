"""Qwen3.5 GGUF files written by llama.cpp's own converter (the pinned source
distribution's convert_hf_to_gguf.py, run here on a random checkpoint) load to the
model transformers computes from the original checkpoint.

The checkpoint has fewer key heads than value heads (so the converter reorders
every value-head axis), random norms, A_log and dt_bias far from their initial
values (a missing "1 +" or a wrong reorder changes the logits), and SmolLM2's
tokenizer (one llama.cpp's converter recognises)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
import transformers

from rvascend.testing import llama_cpp
from rvascend.models import default_model
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models import gguf_checkpoint
from rvascend.models.loader import load_model
from rvascend.engine.testing import assert_fused_decode_matches_op_by_op
from rvascend.models.testing import Runner, tiny_qwen3_5_config


def _checkpoint(tmp, **overrides) -> tuple[transformers.PreTrainedModel, str]:
    """(transformers' FP32 model, its checkpoint directory with the default model's tokenizer)."""
    source = gguf_checkpoint.GgufCheckpoint(default_model.ensure_default_model())
    tokenizer_json, tokenizer_config = source.tokenizer_files()
    vocab = source.config["vocab_size"]
    source.close()
    config = tiny_qwen3_5_config(vocab, tie=False)
    for key, value in overrides.items():
        setattr(config, key, value)
    torch.manual_seed(0)
    hf = transformers.Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand_like(p) * 2 - 1)
            elif p.dim() == 1:
                p.copy_(torch.randn_like(p) * 0.5)
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    hf_dir = str(tmp / "hf")
    hf.save_pretrained(hf_dir)
    # The tokenizer class named, so transformers does not pick Qwen3.5's (which adds a token).
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    for name, content in (("tokenizer.json", tokenizer_json), ("tokenizer_config.json", tokenizer_config)):
        with open(os.path.join(hf_dir, name), "w", encoding="utf-8") as f:
            json.dump(content, f)
    return hf, hf_dir


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[transformers.PreTrainedModel, str, str]:
    """(transformers' FP32 model, its checkpoint directory, the GGUF file llama.cpp wrote from it)."""
    tmp = tmp_path_factory.mktemp("qwen35")
    hf, hf_dir = _checkpoint(tmp)
    return hf, hf_dir, _convert(hf_dir, str(tmp), "f32")


def _convert(hf_dir: str, tmp: str, outtype: str) -> str:
    script = llama_cpp.converter_script(os.path.join(tmp, "llama.cpp"))
    path = os.path.join(tmp, f"model-{outtype}.gguf")
    done = subprocess.run([sys.executable, script, hf_dir, "--outfile", path, "--outtype", outtype, "--no-mtp"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def test_the_file_is_what_llama_cpp_writes_for_qwen35(converted):
    _, _, path = converted
    ckpt = gguf_checkpoint.GgufCheckpoint(path)
    try:
        assert ckpt.arch == "qwen35"
        names = ckpt.type_names()
        # Tiled value heads, A stored as -exp(A_log), norms as 1 + w: the cases undone on load.
        assert {"blk.0.ssm_a", "blk.0.ssm_conv1d.weight", "blk.0.attn_qkv.weight", "blk.0.attn_gate.weight",
                "blk.2.attn_q.weight", "blk.2.attn_q_norm.weight"} <= set(names)
        assert ckpt.config["layer_types"] == ["linear_attention", "linear_attention", "full_attention",
                                              "linear_attention"]
        assert ckpt.config["rope_parameters"]["partial_rotary_factor"] == 0.25
    finally:
        ckpt.close()


def test_logits_equal_transformers_on_the_original_checkpoint(converted):
    hf, hf_dir, path = converted
    tol = 1e-4  # FP32, as qwen3_5_test compares the checkpoint loaded directly
    from_gguf, from_dir = load_model(path, torch.float32), load_model(hf_dir, torch.float32)
    # Every weight as the checkpoint holds it: A_log through -exp and log within 2 ulp,
    # FP32 norms through 1 + w and back within half an ulp of 1 + w (exact from BF16).
    for (name, a), (_, b) in zip(sorted(from_gguf.state_dict().items()), sorted(from_dir.state_dict().items())):
        torch.testing.assert_close(a, b, rtol=3e-7, atol=2 ** -22, msg=name)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, hf.config.vocab_size, (n,), generator=g).tolist() for n in (9, 4)]
    runner = Runner(from_gguf, len(prompts), 0)
    logits = runner.step([(i, p, 0) for i, p in enumerate(prompts)])
    tokens = [list(p) for p in prompts]
    start = 0
    for p in prompts:
        with torch.no_grad():
            want = hf(torch.tensor([p])).logits[0]
        torch.testing.assert_close(logits[start:start + len(p)], want, rtol=tol, atol=tol)
        start += len(p)
    for _ in range(8):  # decode steps: the recurrent state carried from the prefill
        last = [int(hf(torch.tensor([t])).logits[0, -1].argmax()) for t in tokens]
        logits = runner.step([(i, [last[i]], len(tokens[i])) for i in range(len(tokens))])
        for i, t in enumerate(tokens):
            t.append(last[i])
            with torch.no_grad():
                want = hf(torch.tensor([t])).logits[0, -1]
            torch.testing.assert_close(logits[i], want, rtol=tol, atol=tol)


def test_served_in_bf16_the_file_gives_the_checkpoints_weights(converted):
    """In BF16 each weight from the file is the checkpoint's rounded once (the values are
    changed back in FP32 before the rounding)."""
    _, hf_dir, path = converted
    from_gguf, from_dir = load_model(path, torch.bfloat16), load_model(hf_dir, torch.bfloat16)
    for (name, a), (_, b) in zip(sorted(from_gguf.state_dict().items()), sorted(from_dir.state_dict().items())):
        assert a.dtype == b.dtype == torch.bfloat16, name
        assert (a != b).sum() <= max(1, a.numel() // 1000), name  # a tie rounded the other way, at most


def test_a_q8_0_file_serves_kept_quantized_with_the_policy(tmp_path, monkeypatch):
    """llama.cpp's Q8_0 file of such a checkpoint (value heads of 32: whole Q8_0 blocks): every
    projection stays quantized (the DeltaNet layers' in_proj and out_proj included), its value
    heads put back in grouped order block by block, so each dequantizes to exactly the weight
    the dequantized file gives; the logits are the dequantized file's within the error of
    quantizing the activations to 8 bits; the fused decode step is bit-identical to op by op."""
    from rvascend.models.quantized_layers import quantized_modules
    from rvascend.policy import KernelPolicyConfig, install_kernel_policy
    from rvascend.dispatch import shape_gate

    _, hf_dir = _checkpoint(tmp_path, linear_value_head_dim=32)
    path = _convert(hf_dir, str(tmp_path), "q8_0")
    model = load_model(path, torch.float32, keep_quantized=True)
    dequantized = load_model(path, torch.float32)
    kept = dict(quantized_modules(model))
    for layer in (0, 1, 3):
        assert {f"model.layers.{layer}.linear_attn.in_proj", f"model.layers.{layer}.linear_attn.out_proj",
                f"model.layers.{layer}.mlp.gate_up_proj"} <= set(kept)
    assert "model.layers.2.self_attn.qkv_proj" in kept
    for name, module in kept.items():
        if name != "model.embed_tokens":
            assert torch.equal(module.dequantized_weight(), dequantized.get_submodule(name).weight), name
    install_kernel_policy(model, KernelPolicyConfig.from_flag())
    prompt = list(range(100, 130))
    logits, reference = Runner(model, 1, 0).step([(0, prompt, 0)]), Runner(dequantized, 1, 0).step([(0, prompt, 0)])
    err = ((logits - reference).norm() / reference.norm()).item()
    print(f"kept quantized against dequantized: relative error {err:.4f}")
    # The activations' 8-bit quantization, grown through four layers of this deliberately
    # large-weighted model: 0.069 measured (a misplaced shard or row order gives O(1)).
    assert err < 0.15
    monkeypatch.setattr(shape_gate, "measured_packed_wins", lambda m, n, k: True)
    served = load_model(path, torch.bfloat16, keep_quantized=True)
    install_kernel_policy(served, KernelPolicyConfig(compile_mode="eager", shape_gate="measured"))
    assert_fused_decode_matches_op_by_op(served, [prompt[:9], prompt[:4]], 4, 1000)


def test_its_tokenizer_encodes_as_the_checkpoints(converted):
    _, hf_dir, path = converted
    theirs = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ours = Tokenizer(path)
    for text in ("Hello, world! 12345", "naïve café — déjà vu\n\n  indented", "x = [1, 2, 3]  # list"):
        assert ours.encode(text) == theirs.encode(text, add_special_tokens=False), text


def test_a_positive_decay_is_refused(converted, tmp_path):
    """A = -exp(A_log) is negative; a file with A >= 0 has no A_log and is refused."""
    import gguf

    path = str(tmp_path / "positive-decay.gguf")
    shutil.copy(converted[2], path)  # the module's file stays as converted for the other tests
    reader = gguf.GGUFReader(path, "r+")
    (a,) = [t for t in reader.tensors if t.name == "blk.0.ssm_a"]
    a.data[0] = 0.5
    reader.data.flush()
    del reader
    with pytest.raises(ValueError, match="blk.0.ssm_a: holds a decay A that is not negative"):
        load_model(path, torch.float32)


def test_an_output_projection_whose_value_heads_split_blocks_is_dequantized():
    """Value heads are the output projection's columns: they move as whole blocks or not at all."""
    from rvascend.models import gguf_qwen35

    config = {"linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128}
    assert gguf_qwen35.keeps_quantized(config, "ssm_out.weight", 32)        # Q8_0: 4 blocks a head
    assert not gguf_qwen35.keeps_quantized(config, "ssm_out.weight", 256)   # Q4_K: 2 heads a block
    assert gguf_qwen35.keeps_quantized(config, "attn_qkv.weight", 256)      # rows move whole
    assert gguf_qwen35.keeps_quantized(dict(config, linear_num_key_heads=32), "ssm_out.weight", 256)
