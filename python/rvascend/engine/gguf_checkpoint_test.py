"""GGUF files written here, as llama.cpp's converter writes them, from tiny random
Hugging Face checkpoints of the three families; loaded by the engine and checked
against the checkpoint they came from and against transformers' own GGUF loader
(an independent dequantizer and rotary un-permutation)."""

from __future__ import annotations

import os
import shutil
import sys

import gguf
import numpy as np
import pytest
import torch
import transformers

from rvascend.models.random_model import ensure_random_model
from rvascend.tokenizer.tokenizer import Tokenizer
from rvascend.models import gguf_checkpoint, gguf_export
from rvascend.models.loader import load_model
from rvascend.engine.testing import greedy
from rvascend.models.testing import all_logits

Q = gguf.GGMLQuantizationType
COMMON = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=2048, max_position_embeddings=512, initializer_range=0.05,
              rms_norm_eps=1e-5)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True, rope_theta=10000.0),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=False, rope_theta=1000000.0),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True),
}
# One tensor type per role; every quantized type the gguf package can write.
MIXED = {"token_embd": Q.Q8_0, "output": Q.Q8_0, "attn_q": Q.Q4_0, "attn_k": Q.Q4_1, "attn_v": Q.BF16,
         "attn_output": Q.F16, "ffn_gate": Q.Q8_0, "ffn_up": Q.Q5_0, "ffn_down": Q.Q5_1}
PROMPT = torch.randint(0, 2048, (24,), generator=torch.Generator().manual_seed(3))


def _random_k_quant(rows: int, cols: int, qtype: Q, seed: int) -> np.ndarray:
    """Random K-quant blocks with small scales (the gguf package cannot quantize K-quants)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.random.default_rng(seed).integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    scale = np.frombuffer(np.float16(0.002).tobytes(), dtype=np.uint8)
    if qtype == Q.Q4_K:   # d, dmin, scales[12], qs[128]
        raw[..., 0:2] = scale
        raw[..., 2:4] = scale
    elif qtype == Q.Q6_K:  # ql[128], qh[64], scales[16], d
        raw[..., 208:210] = scale
    return raw.reshape(rows, cols // block * size)


def write_gguf(path: str, hf_dir: str, types: dict[str, Q]) -> None:
    """The GGUF of a checkpoint, matrices in F32 unless `types` (role -> type) says otherwise,
    with the tokenizer of the random model (which the tiny checkpoints share)."""
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(ensure_random_model(), name), os.path.join(hf_dir, name))
    k_quants = {role: t for role, t in types.items() if t in (Q.Q4_K, Q.Q6_K)}
    gguf_export.export(hf_dir, path, {r: t for r, t in types.items() if r not in k_quants}, default_type=Q.F32)
    if k_quants:
        # The gguf package cannot quantize K-quants: those tensors get random blocks.
        def k_blocks(t):
            role = t.name.split(".")[-2]
            if role not in k_quants:
                return None
            rows, cols = t.shape[1], t.shape[0]
            return _random_k_quant(int(rows), int(cols), k_quants[role], seed=len(t.name)), k_quants[role]
        rewrite(path, path, k_blocks)


def rewrite(src: str, dst: str, replace, extra: dict[str, np.ndarray] | None = None) -> None:
    """Copies a GGUF, `replace(tensor)` -> (data, type) or None to keep it, plus `extra` tensors."""
    reader = gguf.GGUFReader(src)
    fields = {k: (f.contents(), f.types) for k, f in reader.fields.items()
              if not k.startswith("GGUF.") and k != "general.architecture"}
    tensors = []
    for t in reader.tensors:
        swapped = replace(t)
        tensors.append((t.name, *(swapped or (np.array(t.data), t.tensor_type))))
    arch = reader.fields["general.architecture"].contents()
    del reader
    w = gguf.GGUFWriter(dst, arch)
    for key, (value, types) in fields.items():
        w.add_key_value(key, value, types[0], types[-1] if types[0] == gguf.GGUFValueType.ARRAY else None)
    for name, data, qtype in tensors:
        w.add_tensor(name, data, raw_dtype=qtype)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _tiny_checkpoint(path: str, config) -> str:
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    return request.param, _tiny_checkpoint(str(tmp_path_factory.mktemp(request.param)), FAMILIES[request.param]())


def _hf_logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(PROMPT[None]).logits[0].float()


def test_f32_file_is_the_checkpoint(family, tmp_path):
    name, hf_dir = family
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, {})
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ours = load_model(path, torch.float32)
    assert ours.config.architecture == hf.config.architectures[0]
    assert ours.config.tie_word_embeddings == hf.config.tie_word_embeddings
    assert (all_logits(ours, PROMPT) - _hf_logits(hf)).abs().max().item() < 1e-4
    with torch.no_grad():
        want = hf.generate(PROMPT[None], max_new_tokens=16, do_sample=False)[0, len(PROMPT):].tolist()
    assert greedy(ours, PROMPT, 16) == want


def test_quantized_file_matches_transformers_gguf_loader(family, tmp_path):
    name, hf_dir = family
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, MIXED)
    ours = all_logits(load_model(path, torch.float32), PROMPT)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                              dtype=torch.float32).eval()
    assert (ours - _hf_logits(theirs)).abs().max().item() < 1e-4
    # And against the unquantized checkpoint: only the quantization error apart.
    original = _hf_logits(transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval())
    err = (ours - original).abs().max().item() / original.abs().max().item()
    assert 1e-5 < err < 0.25, err  # 4- and 5-bit blocks of N(0, 0.05) weights: about 10 % per weight


def test_k_quants_match_transformers_gguf_loader(tmp_path):
    hf_dir = _tiny_checkpoint(str(tmp_path / "hf"), FAMILIES["llama"]())
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, {"attn_q": Q.Q4_K, "ffn_down": Q.Q6_K, "ffn_up": Q.Q4_K})
    ours = all_logits(load_model(path, torch.float32), PROMPT)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="model.gguf",
                                                              dtype=torch.float32).eval()
    assert torch.isfinite(ours).all()
    assert (ours - _hf_logits(theirs)).abs().max().item() < 1e-4 * max(1.0, ours.abs().max().item())


CORPUS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "Café, naïve, façade, Ærøskøbing, Straße",
    "中文测试，日本語のテキスト、한국어 문장",
    "emoji 🚀🔥 and flags 🇫🇷 in text 👩‍💻",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\tindent\r\n",
    "    leading spaces, trailing spaces    \n\n\n   ",
    "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
]


def test_tokenizer_is_the_checkpoints(tmp_path):
    hf_dir = _tiny_checkpoint(str(tmp_path / "hf"), FAMILIES["qwen3"]())
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, {})
    ours, original = Tokenizer(path), Tokenizer(ensure_random_model())
    for text in CORPUS + ["numbers 12345 and 3.14159"]:
        assert ours.encode(text) == original.encode(text), text
        assert ours.decode(ours.encode(text)) == original.decode(original.encode(text))
    assert ours.eos_token == "<|eot_id|>" and ours.bos_token == "<|begin_of_text|>"
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert ours.apply_chat_template(chat) == original.apply_chat_template(chat)
    assert ours.apply_chat_template(chat).startswith("<|begin_of_text|><|start_header_id|>user")
    # The same tokenizer.json read by the pure-Python BPE (the board's path).
    from rvascend.tokenizer.bpe_tokenizer import BpeTokenizer

    spec, _ = gguf_checkpoint.GgufCheckpoint(path).tokenizer_files()
    bpe = BpeTokenizer(spec)
    for text in CORPUS:
        assert bpe.encode(text).ids == ours.encode(text), text


def test_converted_directory_serves_the_same(family, tmp_path):
    name, hf_dir = family
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, MIXED)
    out = str(tmp_path / "converted")
    gguf_checkpoint.convert(path, out, torch.float32)
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors",
                                       "tokenizer.json", "tokenizer_config.json"]
    direct, converted = load_model(path, torch.float32), load_model(out, torch.float32)
    assert torch.equal(all_logits(direct, PROMPT), all_logits(converted, PROMPT))
    assert Tokenizer(out).encode(CORPUS[3]) == Tokenizer(path).encode(CORPUS[3])


def test_llama3_rope_freqs_tensor_scales_the_frequencies(tmp_path):
    hf_dir = _tiny_checkpoint(str(tmp_path / "hf"), FAMILIES["llama"]())
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, {})
    plain = load_model(path, torch.float32)
    # A rope_freqs tensor of all ones must change nothing; of 2s, it must.
    for factor, same in ((1.0, True), (2.0, False)):
        scaled = str(tmp_path / f"scaled{factor}.gguf")
        rewrite(path, scaled, lambda t: None, {"rope_freqs.weight": np.full(32, factor, dtype=np.float32)})
        got = all_logits(load_model(scaled, torch.float32), PROMPT)
        assert torch.allclose(got, all_logits(plain, PROMPT), atol=1e-5) == same


def test_llama3_rope_scaling_round_trips_through_rope_freqs(tmp_path):
    config = transformers.LlamaConfig(**COMMON, tie_word_embeddings=True, rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    hf_dir = _tiny_checkpoint(str(tmp_path / "hf"), config)
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    path = str(tmp_path / "model.gguf")
    write_gguf(path, hf_dir, {})
    assert "rope_freqs.weight" in {t.name for t in gguf.GGUFReader(path).tensors}
    assert (all_logits(load_model(path, torch.float32), PROMPT) - _hf_logits(hf)).abs().max().item() < 1e-4


def test_bad_files_get_clear_errors(tmp_path):
    hf_dir = _tiny_checkpoint(str(tmp_path / "hf"), FAMILIES["llama"]())
    good = str(tmp_path / "good.gguf")
    write_gguf(good, hf_dir, MIXED)
    data = open(good, "rb").read()

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) - 4096])
    with pytest.raises(gguf_checkpoint.GgufError, match="truncated"):
        load_model(str(truncated))
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:64])
    with pytest.raises(gguf_checkpoint.GgufError, match="more than the 64-byte file holds"):
        load_model(str(header_only))

    not_gguf = tmp_path / "weights.bin"
    not_gguf.write_bytes(b"\0" * 64)
    with pytest.raises(ValueError, match="not a GGUF file"):
        load_model(str(not_gguf))

    mamba = str(tmp_path / "mamba.gguf")
    w = gguf.GGUFWriter(mamba, "mamba")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(gguf_checkpoint.GgufError, match=r"architecture 'mamba' is not supported.*llama, qwen2, qwen3"):
        load_model(mamba)

    i32 = str(tmp_path / "i32.gguf")
    rewrite(good, i32, lambda t: (np.array(t.data, dtype=np.int32), Q.I32) if t.name == "blk.0.ffn_norm.weight"
            else None)
    with pytest.raises(gguf_checkpoint.GgufError, match="blk.0.ffn_norm.weight has type I32"):
        load_model(i32)


def test_sentencepiece_vocabulary_is_refused_by_name():
    from rvascend.models import gguf_tokenizer

    with pytest.raises(gguf_tokenizer.UnsupportedGgufTokenizer, match="'llama'.*SentencePiece"):
        gguf_tokenizer.tokenizer_files({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["a"]})


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
