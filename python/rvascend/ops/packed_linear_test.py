"""The packed BF16 ops against PyTorch's F.linear and an FP64 reference, eager and compiled."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

from rvascend import ops
from rvascend.ops.testing import pack_reference, thp_advice_recorded, vm_flags


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    """Spacing of BF16 numbers at |x| (8 significant bits)."""
    ax = x.abs().clamp_min(2.0 ** -126)
    return torch.exp2(torch.floor(torch.log2(ax)) - 7)


def _reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact (FP64) result and the allowed error: 1 BF16 ulp + FP32 re-association bound."""
    xd, wd = x.double().reshape(-1, x.shape[-1]), w.double()
    exact = xd @ wd.T
    k = x.shape[-1]
    bound = _bf16_ulp(exact) + 2 * k * 2.0 ** -24 * (xd.abs() @ wd.abs().T)
    return exact, bound


# Layout versions this machine packs: 1 everywhere, 2 where an RVV kernel set reads it.
VERSIONS = [1] + ([2] if ops.WIDE_BLOCK_N else [])


@pytest.mark.parametrize("layout_version", VERSIONS)
@pytest.mark.parametrize("n,k", [(1, 7), (31, 64), (33, 64), (100, 7), (300, 64), (1024, 2048), (3072, 1024)])
def test_pack_matches_layout_definition(n, k, layout_version):
    w = torch.randn(n, k).bfloat16()
    packed = ops.pack_bf16_weight(w, layout_version)
    b = 32 if layout_version == 1 else ops.WIDE_BLOCK_N
    assert packed.shape == (-(-n // b), k, b)
    assert torch.equal(packed, pack_reference(w, layout_version))


@pytest.mark.parametrize("n,k", [(1, 7), (33, 64), (300, 64), (1024, 96)])
def test_unpack_is_the_exact_inverse_of_pack(n, k):
    w = torch.randn(n, k).bfloat16()
    assert torch.equal(ops.unpack_bf16_weight(ops.pack_bf16_weight(w, 1), n, 1), w)
    # Version 2 at every wide block the kernels read, whether or not this CPU packs it.
    for b in (64, 128, 256, 512):
        assert torch.equal(ops.unpack_bf16_weight(pack_reference(w, 2, b), n, 2), w), b
    with pytest.raises(ValueError, match="does not match the packed weight"):
        ops.unpack_bf16_weight(ops.pack_bf16_weight(w, 1), -(-n // 32) * 32 + 1, 1)


@pytest.mark.parametrize("layout_version", VERSIONS)
@pytest.mark.parametrize("blocks,k,scratch", [(1, 7, 1), (5, 64, 1), (7, 96, 3 * 512 * 96 * 2), (12, 33, 1 << 20)])
def test_pack_in_place_equals_pack_and_reuses_the_storage(layout_version, blocks, k, scratch):
    b = 32 if layout_version == 1 else ops.WIDE_BLOCK_N
    w = torch.randn(blocks * b, k).bfloat16()
    want = ops.pack_bf16_weight(w, layout_version)
    ptr = w.data_ptr()
    got = ops.pack_bf16_weight_in_place(w, layout_version, scratch_bytes=scratch)
    assert got.data_ptr() == ptr and torch.equal(got, want)
    with pytest.raises(ValueError, match="multiple of the block"):
        ops.pack_bf16_weight_in_place(torch.zeros(b + 1, k, dtype=torch.bfloat16), layout_version)


def test_pack_example_shape_from_the_contract():
    assert ops.pack_bf16_weight(torch.zeros(3072, 2048, dtype=torch.bfloat16), 1).shape == (96, 2048, 32)


def test_layout_version_2_is_this_machines_or_refused():
    w = torch.randn(300, 64).bfloat16()
    if not ops.WIDE_BLOCK_N:
        assert ops.LAYOUT_VERSION == 1
        with pytest.raises(ValueError, match="layout version 2 is packed for an RVV CPU"):
            ops.pack_bf16_weight(w, 2)
        return
    assert ops.LAYOUT_VERSION == 2 and ops.WIDE_BLOCK_N == int(ops.cpu_features().split("vlen=")[1].split()[0]) // 2
    x = torch.randn(5, 64).bfloat16()
    exact, bound = _reference(x, w)
    for version in (1, 2):
        got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w, version), 300, version)
        assert bool(((got.double() - exact).abs() <= bound).all()), version
    # A weight packed for one layout is never read as the other.
    with pytest.raises(ValueError, match="layout version 1"):
        ops.packed_bf16_linear(x, ops.pack_bf16_weight(w, 2), 300, 1)
    with pytest.raises(ValueError, match="reads block_n"):
        with ops.use_kernel_set("rvv"):
            ops.packed_bf16_linear(x, ops.pack_bf16_weight(w, 2), 300, 2)


def test_pack_non_contiguous_weight():
    w = torch.randn(64, 96).bfloat16()
    assert torch.equal(ops.pack_bf16_weight(w.T.contiguous().T), ops.pack_bf16_weight(w))
    assert torch.equal(ops.pack_bf16_weight(w[:, ::2]), pack_reference(w[:, ::2].contiguous(), ops.LAYOUT_VERSION))


@pytest.mark.parametrize("make", [
    lambda: torch.randn(1, 1024).bfloat16().expand(512, 1024),       # row stride 0
    lambda: torch.randn(1024, 1).bfloat16().expand(1024, 1024),      # column stride 0
    lambda: torch.randn(64 * 256 + 256).bfloat16().as_strided((64, 512), (256, 1)),  # overlapping rows
    lambda: torch.randn(40, 8, 64).bfloat16()[:, 3, :],              # row stride > K
    lambda: torch.randn(300, 64).bfloat16()[100:200],                # storage offset
])
def test_pack_any_strided_weight_like_its_contiguous_copy(make):
    w = make()
    assert torch.equal(ops.pack_bf16_weight(w), pack_reference(w.contiguous(), ops.LAYOUT_VERSION))
    x = torch.randn(3, w.shape[1]).bfloat16()
    got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w), w.shape[0])
    assert torch.isfinite(got.float()).all()


def test_native_entry_points_check_the_strides_they_are_given():
    from rvascend.ops.packed_linear import _native
    w = torch.randn(8, 64).bfloat16()
    out = torch.empty(1, 64, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="smaller than K"):
        _native.pack_bf16_weight(w.data_ptr(), 8, 64, 0, w.numel(), out.data_ptr(), 32)
    with pytest.raises(ValueError, match="needs .* elements"):
        _native.pack_bf16_weight(w.data_ptr(), 8, 64, 64, w.numel() - 1, out.data_ptr(), 32)
    with pytest.raises(ValueError, match="block_n 48"):
        _native.pack_bf16_weight(w.data_ptr(), 8, 64, 64, w.numel(), out.data_ptr(), 48)
    y = torch.empty(2, 8, dtype=torch.bfloat16)
    x = torch.randn(2, 64).bfloat16()
    with pytest.raises(ValueError, match="reaches past"):
        _native.packed_bf16_linear("", 2, 8, 64, x.data_ptr(), 64, x.numel(), out.data_ptr(),
                                   out.numel() - 1, 32, y.data_ptr(), 8, y.numel(), 1)
    with pytest.raises(ValueError, match="input .* reaches past"):
        _native.packed_bf16_linear("", 3, 8, 64, x.data_ptr(), 64, x.numel(), out.data_ptr(),
                                   out.numel(), 32, y.data_ptr(), 8, 3 * 8, 1)


def test_weight_fingerprint_sees_any_sampled_change_and_ignores_strides():
    w = torch.randn(2048, 1024).bfloat16()
    f = ops.weight_fingerprint(w)
    assert f == ops.weight_fingerprint(w.clone()) == ops.weight_fingerprint(w.T.contiguous().T)
    assert f != ops.weight_fingerprint(w * 2)
    assert f != ops.weight_fingerprint(-w)
    assert f != ops.weight_fingerprint(torch.randn_like(w))
    with pytest.raises(ValueError, match="2-D BF16"):
        ops.weight_fingerprint(w.float())


@pytest.mark.parametrize("threads", [1, 2, 3, 16])
def test_weight_fingerprints_match_names_the_first_changed_weight_on_any_thread_count(threads):
    from rvascend.ops.packed_linear import _native

    torch.manual_seed(5)
    weights = [torch.randn(64 + 8 * i, 96).bfloat16() for i in range(7)]
    weights[3] = weights[3].T.contiguous().T  # a column-major one: its strides are checked too
    samples = 128

    table = torch.tensor([ops.packed_linear.fingerprint_descriptor_row(w, ops.weight_fingerprint(w, samples))
                          for w in weights], dtype=torch.int64)
    check = lambda: _native.weight_fingerprints_match(table.data_ptr(), len(weights), samples, threads)  # noqa: E731
    assert check() == -1
    weights[5].neg_()  # in place: the descriptor's pointers now read changed content
    assert check() == 5
    weights[1].mul_(2)  # an earlier one too, in another thread's share: the first is named
    assert check() == 1
    weights[0][0, 0] += 1  # the first row's first run is always sampled
    assert check() == 0


SHAPES = [(m, n, k) for m in list(range(1, 18)) + [64, 128] for n, k in [(1, 7), (33, 64), (100, 129)]]
SHAPES += [(m, 1024, 2048) for m in (1, 2, 3, 4, 8, 16, 64)] + [(1, 3072, 2048), (4, 2048, 8192)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_linear_matches_fp64_and_f_linear(m, n, k):
    torch.manual_seed(m * 7919 + n * 31 + k)
    x = torch.randn(m, k).bfloat16()
    w = (torch.randn(n, k) / k ** 0.5).bfloat16()
    got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w), n)
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    exact, bound = _reference(x, w)
    err = (got.double() - exact).abs()
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"
    # PyTorch's own BF16 linear rounds once too: the two may differ by at most
    # one rounding step each side of the exact value.
    theirs = F.linear(x, w)
    assert bool(((got.double() - theirs.double()).abs() <= 2 * bound).all())


@pytest.mark.parametrize("kernel_set", ops.available_kernel_sets())
def test_every_kernel_set_agrees(kernel_set):
    torch.manual_seed(0)
    x = torch.randn(5, 300).bfloat16()
    w = torch.randn(257, 300).bfloat16()
    version = ops.kernel_set_layout_version(kernel_set)
    packed = ops.pack_bf16_weight(w, version)
    with ops.use_kernel_set(kernel_set):
        got = ops.packed_bf16_linear(x, packed, 257, version)
    exact, bound = _reference(x, w)
    assert bool(((got.double() - exact).abs() <= bound).all())


def test_leading_dims_are_flattened_and_restored():
    x = torch.randn(2, 3, 64).bfloat16()
    w = torch.randn(40, 64).bfloat16()
    got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w), 40)
    assert got.shape == (2, 3, 40)
    assert torch.equal(got.reshape(6, 40), ops.packed_bf16_linear(x.reshape(6, 64), ops.pack_bf16_weight(w), 40))


def test_non_contiguous_input_is_not_misread():
    w = torch.randn(96, 64).bfloat16()
    packed = ops.pack_bf16_weight(w)
    base = torch.randn(64, 10).bfloat16()
    x = base.T  # [10, 64] with stride (1, 10)
    assert not x.is_contiguous()
    assert torch.equal(ops.packed_bf16_linear(x, packed, 96), ops.packed_bf16_linear(x.contiguous(), packed, 96))
    wide = torch.randn(10, 200).bfloat16()[:, 50:114]  # row stride 200
    assert torch.equal(ops.packed_bf16_linear(wide, packed, 96), ops.packed_bf16_linear(wide.contiguous(), packed, 96))


def test_results_do_not_depend_on_thread_count():
    x = torch.randn(9, 512).bfloat16()
    packed = ops.pack_bf16_weight(torch.randn(1000, 512).bfloat16())
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.packed_bf16_linear(x, packed, 1000)
        torch.set_num_threads(2)
        two = ops.packed_bf16_linear(x, packed, 1000)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_rounding_is_nearest_even_not_truncation():
    # The exact sum 1 + 3*2^-9 is 0.75 of a BF16 step (2^-7) above 1.0:
    # round-to-nearest gives 1 + 2^-7, truncation (a known peer's choice) 1.0.
    x = torch.tensor([[1.0, 1.0]], dtype=torch.bfloat16)
    w = torch.tensor([[1.0, 3 * 2.0 ** -9]], dtype=torch.bfloat16)
    got = ops.packed_bf16_linear(x, ops.pack_bf16_weight(w), 1)
    assert got.item() == 1 + 2.0 ** -7


def test_torch_compile_fullgraph_matches_eager():
    w = torch.randn(100, 64).bfloat16()
    packed = ops.pack_bf16_weight(w)

    def f(x):
        return torch.relu(torch.ops.rvascend.packed_bf16_linear(x, packed, 100)) * 2

    x = torch.randn(3, 64).bfloat16()
    # The riscv64 image has no C++ compiler for Inductor: it traces with aot_eager.
    backend = os.environ.get("RVASCEND_COMPILE_BACKEND", "inductor")
    compiled = torch.compile(f, fullgraph=True, dynamic=False, backend=backend)
    assert torch.equal(compiled(x), f(x))


def test_fake_implementations_give_shapes_without_data():
    w = torch.empty(100, 64, dtype=torch.bfloat16, device="meta")
    packed = torch.ops.rvascend.pack_bf16_weight(w, 1)
    assert packed.device.type == "meta" and packed.shape == (4, 64, 32)
    x = torch.empty(2, 5, 64, dtype=torch.bfloat16, device="meta")
    assert torch.ops.rvascend.packed_bf16_linear(x, packed, 100, 1).shape == (2, 5, 100)


def _linear_v1(x: torch.Tensor, p: torch.Tensor, n: int) -> torch.Tensor:
    return ops.packed_bf16_linear(x, p, n, layout_version=1)


@pytest.mark.parametrize("make,error,match", [
    (lambda x, p: _linear_v1(x.float(), p, 40), TypeError, "input must be bfloat16"),
    (lambda x, p: _linear_v1(x, p.float(), 40), TypeError, "packed_weight must be bfloat16"),
    (lambda x, p: _linear_v1(x, p[0], 40), ValueError, r"must have shape \[ceil"),
    (lambda x, p: _linear_v1(x[:, :63], p, 40), ValueError, "K = 63"),
    (lambda x, p: _linear_v1(x, p, 65), ValueError, "out_features = 65 does not fit"),
    (lambda x, p: _linear_v1(x, p, 20), ValueError, "packed for another weight"),
    (lambda x, p: ops.packed_bf16_linear(x, p, 40, layout_version=3), ValueError, "layout version 3"),
    (lambda x, p: ops.pack_bf16_weight(torch.zeros(4, 4)), TypeError, "weight must be bfloat16"),
    (lambda x, p: ops.pack_bf16_weight(torch.zeros(4, dtype=torch.bfloat16)), ValueError, "2-D"),
    (lambda x, p: ops.pack_bf16_weight(torch.zeros(4, 4, dtype=torch.bfloat16), 0), ValueError, "layout version 0"),
])
def test_bad_input_raises_a_clear_error(make, error, match):
    x = torch.randn(3, 64).bfloat16()
    packed = ops.pack_bf16_weight(torch.randn(40, 64).bfloat16(), 1)
    with pytest.raises(error, match=match):
        make(x, packed)


def test_mixed_devices_are_rejected():
    packed = ops.pack_bf16_weight(torch.randn(40, 64).bfloat16())
    x = torch.empty(3, 64, dtype=torch.bfloat16, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError)):
        ops.packed_bf16_linear(x, packed, 40).cpu()


def test_unknown_kernel_set_is_rejected():
    with pytest.raises(ValueError, match="not available"):
        with ops.use_kernel_set("no-such-kernels"):
            pass


def test_packed_weight_bytes():
    assert ops.packed_weight_bytes(3072, 2048, layout_version=1) == 96 * 32 * 2048 * 2
    assert ops.packed_weight_bytes(33, 10, layout_version=1) == 64 * 10 * 2
    if ops.WIDE_BLOCK_N:
        assert ops.packed_weight_bytes(33, 10, layout_version=2) == ops.WIDE_BLOCK_N * 10 * 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")
def test_weights_are_packed_into_huge_page_advised_memory():
    """The packers (BF16 and GGML repack) ask for huge pages before they write; a buffer
    with no whole 2 MiB page is left alone."""
    from rvascend.runtime import allocator
    from rvascend.ops import quantized_linear as q

    allocator.pin_mmap_threshold()  # each buffer its own mapping, with its own flags (as while loading)
    thp = thp_advice_recorded()
    w = torch.randn(4096, 1024).to(torch.bfloat16)  # 8 MiB: whole huge pages inside
    packed = ops.pack_bf16_weight(w)
    raw = torch.zeros(4096, 1024 // 32 * 34, dtype=torch.uint8).numpy()
    repacked = q.repack_ggml(raw, "Q8_0", 4096, 1024)
    for buffer in (packed, repacked):
        middle = buffer.data_ptr() + buffer.numel() * buffer.element_size() // 2
        assert ("hg" in vm_flags(middle)) == thp
    small = torch.empty(1 << 20, dtype=torch.uint8)
    assert not ops.packed_linear.advise_huge_pages(small)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
