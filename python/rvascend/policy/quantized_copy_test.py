"""A model's own weights quantized in memory (the STANDALONE draft of
--speculative-draft-model-quantization): the blocks are llama.cpp's reference
quantizer's, bit for bit (the gguf package's port of it); the copy's projections are
those blocks and everything else is the model's own tensors; a GGUF kept quantized is
requantized from its values; what cannot be copied is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from rvascend.models.random_model import ensure_random_model
from rvascend.models.testing import IMAGE_LLAMA, TINY_QWEN3_5, write_random_checkpoint
from rvascend.models.loader import load_model
from rvascend.models.quantized_copy import quantize_ggml, quantized_copy
from rvascend.models.quantized_layers import QuantizedLinear, QuantPart
from rvascend.ops import quantized_linear as qops
from rvascend.policy import KernelPolicyConfig, install_kernel_policy

GGML = {"q4_0": GGMLQuantizationType.Q4_0, "q8_0": GGMLQuantizationType.Q8_0}
SMALL_LLAMA = dict(IMAGE_LLAMA, hidden_size=256, intermediate_size=256, num_attention_heads=4, head_dim=64)


def _awkward_weight() -> np.ndarray:
    w = np.random.default_rng(3).standard_normal((6, 128)).astype(np.float32)
    w[0, :32] = 0.0                          # an all-zero block: scale 0, every code the middle
    w[1, :32] = np.linspace(-1, 1, 32)       # its largest magnitudes tie in size, opposite signs
    w[2, 32:64] = 7.0                        # one value throughout
    w[3, :32] = np.arange(32) - 16.0         # codes exactly halfway for Q8_0's rounding
    w[4] *= 1e-30                            # scales below FP16's range
    w[5] *= 6e4                              # at FP16's top
    return w


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_blocks_are_llama_cpps(fmt):
    w = _awkward_weight()
    np.testing.assert_array_equal(quantize_ggml(w, fmt), quants.quantize(w, GGML[fmt]))


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_ggml(np.zeros((2, 40), np.float32), "q4_0")
    with pytest.raises(ValueError, match="q4_0, q8_0"):
        quantize_ggml(np.zeros((2, 32), np.float32), "q4_1")


@pytest.fixture(scope="module")
def target():
    return load_model(ensure_random_model(), torch.bfloat16)


@pytest.mark.parametrize("fmt", ["q4_0", "q8_0"])
def test_the_copy_is_the_models_weights_quantized(target, fmt):
    copy = quantized_copy(target, fmt)
    quantized = {n: m for n, m in copy.named_modules() if isinstance(m, QuantizedLinear)}
    layers = target.config.num_hidden_layers
    # qkv, o, gate_up, down per layer, and the embedding, which is the tied lm_head as in a GGUF.
    assert len(quantized) == 4 * layers + 1 and copy.lm_head is copy.model.embed_tokens
    for name, module in quantized.items():
        w = target.get_submodule(name).weight.detach().float()
        want = quants.dequantize(quants.quantize(w.numpy(), GGML[fmt]), GGML[fmt])
        np.testing.assert_array_equal(module.dequantized_weight(torch.float32).numpy(), want)
    # The norms are the model's own tensors; the embedding is not (the policy drops a tied one's rows).
    assert copy.model.layers[0].input_layernorm.weight is target.model.layers[0].input_layernorm.weight
    assert copy.model.norm.weight is target.model.norm.weight
    own = sum(m.packed_bytes for m in quantized.values())
    dense = sum(m.weight.numel() for n, m in target.named_modules() if n in quantized)
    assert own < dense * (1.07 if fmt == "q8_0" else 0.57)


def test_an_untied_lm_head_is_its_own_matrix():
    untied = load_model(write_random_checkpoint(dict(SMALL_LLAMA, tie_word_embeddings=False)), torch.bfloat16)
    copy = quantized_copy(untied, "q8_0")
    assert copy.lm_head is not copy.model.embed_tokens and isinstance(copy.lm_head, QuantizedLinear)
    w = untied.lm_head.weight.detach().float().numpy()
    np.testing.assert_array_equal(copy.lm_head.dequantized_weight(torch.float32).numpy(),
                                  quants.dequantize(quants.quantize(w, GGML["q8_0"]), GGML["q8_0"]))


def test_a_width_that_is_not_whole_blocks_is_refused_by_name():
    odd = load_model(write_random_checkpoint(dict(SMALL_LLAMA, intermediate_size=200)), torch.bfloat16)
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.down_proj's rows of 200 values"):
        quantized_copy(odd, "q4_0")


def test_a_kept_quantized_gguf_is_requantized_from_its_values(tmp_path):
    from rvascend.models import gguf_export

    path = str(tmp_path / "m.gguf")
    gguf_export.export(ensure_random_model(), path, {role: GGMLQuantizationType.Q4_1 for role in
                                                     ("ffn_down", "ffn_up", "ffn_gate", "token_embd")})
    model = load_model(path, torch.bfloat16, keep_quantized=True)
    copy = quantized_copy(model, "q4_0")
    source = model.model.layers[0].mlp.down_proj
    assert isinstance(source, QuantizedLinear) and source.parts[0].fmt == "Q4_1"
    w = source.dequantized_weight(torch.float32).numpy()
    got = copy.model.layers[0].mlp.down_proj.dequantized_weight(torch.float32).numpy()
    np.testing.assert_array_equal(got, quants.dequantize(quants.quantize(w, GGML["q4_0"]), GGML["q4_0"]))
    # The Q4_1 table requantized, the tied lm_head with it.
    assert copy.lm_head is copy.model.embed_tokens and copy.lm_head.parts[0].fmt == "Q4_0"
    table = model.model.embed_tokens.dequantized_weight(torch.float32).numpy()
    np.testing.assert_array_equal(copy.model.embed_tokens.dequantized_weight(torch.float32).numpy(),
                                  quants.dequantize(quants.quantize(table, GGML["q4_0"]), GGML["q4_0"]))


def test_what_cannot_be_copied_is_refused(target):
    with pytest.raises(ValueError, match="expected one of q4_0, q8_0"):
        quantized_copy(target, "q4_k")
    hybrid = load_model(write_random_checkpoint(TINY_QWEN3_5), torch.bfloat16)
    with pytest.raises(ValueError, match="recurrent layers"):
        quantized_copy(hybrid, "q4_0")
    routed = load_model(ensure_random_model(), torch.bfloat16)
    install_kernel_policy(routed, KernelPolicyConfig(compile_mode="eager"))
    with pytest.raises(ValueError, match="before the kernels' policy"):
        quantized_copy(routed, "q4_0")


def test_the_copy_runs_on_the_quantized_kernels(target):
    copy = quantized_copy(target, "q8_0")
    x = torch.randn(3, target.config.hidden_size, dtype=torch.bfloat16)
    module = copy.model.layers[1].self_attn.o_proj
    want = torch.nn.functional.linear(x.float(), module.dequantized_weight(torch.float32))
    got = module(x).float()
    assert torch.allclose(got, want, rtol=0.02, atol=0.02 * want.abs().max().item())
    assert qops.FORMATS  # the kernels' registry knows the format


def test_rows_of_a_projection_in_parts_are_its_whole_matrixs():
    """A block of rows of a projection stored in two parts (a Q4_K_M file's Q4_K q beside its
    Q6_K v): the same values as those rows of the whole matrix, across the parts' seam."""
    tile = qops.quant_tile()
    w = np.random.default_rng(5).standard_normal((96, 64)).astype(np.float32)
    module = QuantizedLinear(64, [QuantPart("Q4_0", 40, tile), QuantPart("Q8_0", 56, tile)])
    module.set_part(0, qops.repack_ggml(quantize_ggml(w[:40], "q4_0"), "Q4_0", 40, 64, tile))
    module.set_part(1, qops.repack_ggml(quantize_ggml(w[40:], "q8_0"), "Q8_0", 56, 64, tile))
    whole = module.dequantized_weight(torch.float32)
    for start, end in ((0, 96), (10, 40), (35, 50), (40, 41), (60, 96)):
        assert torch.equal(module.dequantized_weight(torch.float32, start, end), whole[start:end])
