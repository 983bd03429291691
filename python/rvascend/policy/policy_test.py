"""The RVV policy on a small fused-projection model and on Hugging Face's Llama."""

from __future__ import annotations

import copy
import gc
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from rvascend import ops
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy, invalidate_packed_weights, repack
from rvascend.dispatch import weights_generation
from rvascend.policy.install import packed_buffer_names
from rvascend.policy.testing import make, transformers_llama

MIB = 1 << 20
# The seed's gate: its contract (N, K >= 1024, buckets, lm_head prefill rows) routes alike
# on every host; the measured gate's routes are tested in shape_gate_test.py.
EAGER = KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed")


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a.float(), b.float(), rtol=3e-2, atol=3e-2 * b.float().abs().max().item())


@pytest.fixture(scope="module")
def pair():
    base = make()
    routed = copy.deepcopy(base)
    report = install_kernel_policy(routed, EAGER)
    return base, routed, report


def test_report_lists_what_was_packed(pair):
    _, routed, report = pair
    kinds = sorted({p for _, p, _ in report.packed})
    assert kinds == ["down_proj", "gate_up_proj", "lm_head", "o_proj", "qkv_proj"]
    modules = dict(routed.named_modules(remove_duplicate=False))
    assert report.packed_bytes == sum(ops.packed_weight_bytes(*modules[name].weight.shape)
                                      for name, _, _ in report.packed)


@pytest.mark.parametrize("rows", list(range(1, 21)) + [16, 31, 64, 100, 128])
def test_same_logits_and_greedy_tokens(pair, rows):
    base, routed, _ = pair
    ids = torch.randint(0, 2048, (rows,), generator=torch.Generator().manual_seed(rows))
    with torch.no_grad():
        want, got = base(ids), routed(ids)
    assert close(got, want)
    top2 = want.float().topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp_min(1e-3)
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])


def test_rows_take_packed_path_through_buckets(pair, monkeypatch):
    from rvascend.dispatch import route as route_module

    _, routed, _ = pair
    policy = get_policy(routed)
    policy.counters.reset()
    kernel_rows = []
    kernel = route_module.ops.packed_bf16_linear

    def recording(x, packed, n):
        kernel_rows.append(x.shape[0])
        return kernel(x, packed, n)
    monkeypatch.setattr(route_module.ops, "packed_bf16_linear", recording)
    with torch.no_grad():
        routed(torch.arange(3))   # M = 3 runs the 4-row bucket
        routed(torch.arange(9))   # M = 9 shares the 16-row one
        routed(torch.arange(40))  # prefill rows: the 64-row bucket (lm_head falls back)
    assert policy.counters.rows_seen("qkv_proj", "packed") == {3: 2, 9: 2, 40: 2}
    assert policy.counters.calls("lm_head", "packed") == 2
    assert set(kernel_rows) == {4, 16, 64}


def test_state_dict_has_no_packed_buffer(pair):
    _, routed, _ = pair
    assert packed_buffer_names(routed)
    assert not any("_rvv_packed" in key for key in routed.state_dict())


def test_tied_lm_head_keeps_identity(pair):
    _, routed, _ = pair
    assert routed.lm_head is routed.model.embed_tokens
    ids = torch.tensor([5, 7])
    assert torch.equal(routed.model.embed_tokens(ids), routed.model.embed_tokens.weight[ids])


def test_broken_tie_is_rejected():
    model = make()
    model.lm_head = nn.Linear(1024, 2048, bias=False).to(torch.bfloat16)
    with pytest.raises(RuntimeError, match="tie_word_embeddings"):
        install_kernel_policy(model, EAGER)


def test_deleting_the_model_frees_packed_memory():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    buffers = [weakref.ref(m._buffers["_rvv_packed_weight"]) for m in model.modules()
               if "_rvv_packed_weight" in m._buffers]
    assert buffers and all(b() is not None for b in buffers)
    del model
    gc.collect()
    assert all(b() is None for b in buffers)


def _counted(model, reason: str) -> int:
    return get_policy(model).counters.calls(route="fallback", reason=reason)


def _qkv(model):
    return model.model.layers[0].self_attn.qkv_proj


def _scaled_state(m: nn.Module) -> dict:
    state = {k: v.clone() for k, v in m.state_dict().items()}
    state["model.layers.0.self_attn.qkv_proj.weight"] *= -2
    return state


# Every staleness case writes NEW values (the same write on the reference
# model), so serving the stale packed copy would fail the output check.
@pytest.mark.parametrize("reason,setup,inputs", [
    ("bias", None, None),
    ("small_features", None, None),
    ("small_macs", None, lambda: torch.zeros(0, dtype=torch.long)),
    ("non_cpu", None, "meta"),
    ("lm_head_prefill_rows", None, lambda: torch.arange(20)),
    ("weight_replaced", lambda m: setattr(_qkv(m), "weight", nn.Parameter(_qkv(m).weight.detach() * 2)), None),
    ("weight_storage_changed", lambda m: setattr(_qkv(m).weight, "data", _qkv(m).weight.detach() * 2), None),
    ("weight_mutated_in_place", lambda m: _in_place(_qkv(m).weight), None),
    ("weight_content_changed", lambda m: _qkv(m).weight.data.mul_(2), None),
    ("invalidated", lambda m: m.load_state_dict(_scaled_state(m)), None),
])
def test_each_fallback_reason_is_reached_and_counted(reason, setup, inputs):
    if reason == "bias":
        model = make(layers=1, qkv_bias=True)
    elif reason == "small_features":
        model = make(hidden=512, inter=512, vocab=512, layers=1)
    else:
        model = make(layers=1)
    reference = copy.deepcopy(model)
    install_kernel_policy(model, EAGER)
    if setup is not None:
        before = _qkv(reference).weight.detach().clone()
        setup(model)
        setup(reference)
        assert not torch.equal(_qkv(reference).weight, before), "the write must change the weight"
    if inputs == "meta":
        qkv = _qkv(model)
        out = qkv(torch.randn(2, qkv.in_features, device="meta", dtype=torch.bfloat16))
        assert out.shape == (2, qkv.out_features)
    else:
        ids = inputs() if inputs else torch.arange(4)
        with torch.no_grad():
            out = model(ids)
        with torch.no_grad():
            want = reference(ids)
        # A stale packed copy is never used: results follow the current weight.
        assert close(out, want) if out.numel() else out.shape == want.shape
    assert _counted(model, reason) >= 1, get_policy(model).counters.snapshot()


def _qkv_out(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return _qkv(model)(x)


@pytest.mark.parametrize("write", [
    "data_mul", "data_copy", "data_swap_restore", "numpy_view",
])
def test_writes_that_bypass_the_version_counter_are_never_served_stale(write):
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    qkv = _qkv(model)
    x = torch.randn(1, qkv.in_features, dtype=torch.bfloat16)
    _qkv_out(model, x)
    assert get_policy(model).counters.calls("qkv_proj", "packed") == 1
    w = qkv.weight
    version = w._version
    if write == "data_mul":
        w.data.mul_(2)
    elif write == "data_copy":  # the write pattern of SGLang's and vLLM's weight loaders
        w.data.copy_(torch.randn_like(w))
    elif write == "data_swap_restore":  # restores pointer, shape, stride and version
        s = w.data
        w.data = torch.zeros_like(w)
        s.mul_(-1)
        w.data = s
    else:
        w.data.view(torch.int16).numpy()[:] ^= -0x8000  # flip every sign bit behind torch's back
    assert w._version == version, "this write path must bypass the version counter"
    generation = weights_generation.current(model)
    got = _qkv_out(model, x)
    want = F.linear(x.float(), w.detach().float()).bfloat16()
    assert close(got, want)
    assert _counted(model, "weight_content_changed") == 1
    # The check that fired retires what was computed from the old weights (the prefix
    # cache), once per change: the next call sees the same stale copy and moves nothing.
    assert weights_generation.current(model) == generation + 1
    _qkv_out(model, x)
    assert weights_generation.current(model) == generation + 1


def test_staleness_check_costs_little_per_call():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    route = get_policy(model).routes["model.layers.0.self_attn.qkv_proj"]
    weight = _qkv(model).weight
    assert route.packed_weight(weight)[1] is None
    import time
    start = time.perf_counter()
    for _ in range(2000):
        route.packed_weight(weight)
    per_call = (time.perf_counter() - start) / 2000
    # The check is O(1) in the weight's size: far below one M=1 projection.
    assert per_call < 100e-6, per_call


def test_bad_budget_leaves_the_model_untouched():
    model = make(layers=1)
    before = {n: m.__dict__.copy() for n, m in model.named_modules()}
    with pytest.raises(ValueError, match="memory budget"):
        install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed", memory_budget_mib=-1))
    assert get_policy(model) is None and not packed_buffer_names(model)
    assert not model._load_state_dict_post_hooks
    for n, m in model.named_modules():
        assert "forward" not in m.__dict__ and "_rvv_route" not in m.__dict__, n
        assert m.__dict__.keys() == before[n].keys(), n
    install_kernel_policy(model, EAGER)  # a retry with a good config works
    assert len(packed_buffer_names(model)) == 5


def test_failure_while_packing_undoes_the_install(monkeypatch):
    model = make(layers=1)
    from rvascend.dispatch import route as route_module

    def fail(self):
        raise MemoryError("simulated")
    monkeypatch.setattr(route_module.ProjectionRoute, "pack", fail)
    with pytest.raises(MemoryError):
        install_kernel_policy(model, EAGER)
    assert get_policy(model) is None and not model._load_state_dict_post_hooks
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_outer_torch_compile_never_serves_stale_and_still_packs():
    torch._dynamo.reset()
    model = make(layers=1)
    reference = copy.deepcopy(model)
    install_kernel_policy(model, EAGER)
    compiled = torch.compile(model, backend="eager")
    ids = torch.arange(1)
    counters = get_policy(model).counters
    with torch.no_grad():
        assert close(compiled(ids), reference(ids))
    assert counters.calls(route="packed") == 5, counters.snapshot()
    for m in (model, reference):
        _in_place(_qkv(m).weight)
    with torch.no_grad():
        assert close(compiled(ids), reference(ids))
    assert counters.calls("qkv_proj", "fallback", "weight_mutated_in_place") == 1, counters.snapshot()
    repack(model)
    counters.reset()
    with torch.no_grad():
        assert close(compiled(ids), reference(ids))
    assert counters.calls(route="packed") == 5, counters.snapshot()


def test_autograd_falls_back_and_gives_the_gradient():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    qkv = _qkv(model)
    x = torch.randn(1, qkv.in_features, dtype=torch.bfloat16, requires_grad=True)
    qkv(x).float().sum().backward()
    x_ref = x.detach().clone().requires_grad_(True)
    F.linear(x_ref, qkv.weight.detach()).float().sum().backward()
    assert x.grad is not None and torch.equal(x.grad, x_ref.grad)
    assert qkv.weight.grad is not None
    assert _counted(model, "grad_required") == 1


def test_invariant_gate_packs_a_biased_projection_and_adds_its_bias():
    # Qwen2's q/k/v biases: under deterministic inference the projection is packed and its
    # bias added to each output after the product (a row alone and within three rows give the
    # same bits); the measured and bucketed gates leave a biased projection to F.linear.
    for config, route in ((KernelPolicyConfig(deterministic=True), "packed"), (EAGER, "fallback")):
        model = make(layers=1, qkv_bias=True)
        qkv = _qkv(model)
        weight, bias = qkv.weight.detach().clone(), qkv.bias.detach().clone()
        install_kernel_policy(model, config)
        x = torch.randn(3, qkv.in_features, dtype=torch.bfloat16)
        with torch.inference_mode():
            got, first = qkv(x), qkv(x[:1])
        assert close(got, F.linear(x, weight, bias)) and torch.equal(got[:1], first)
        assert get_policy(model).counters.calls("qkv_proj", route) == 2, config


def test_fp32_model_falls_back_on_input_dtype():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    model.float()
    reference = make(layers=1).float()
    with torch.no_grad():
        assert close(model(torch.arange(3)), reference(torch.arange(3)))
    assert _counted(model, "input_dtype") == 5


def test_weight_dtype_change_is_never_served_from_the_stale_copy():
    model = make(layers=1)
    reference = copy.deepcopy(model)
    install_kernel_policy(model, EAGER)
    qkv = _qkv(model)
    qkv.float()
    with pytest.raises(RuntimeError):  # exactly what F.linear does with mixed dtypes
        qkv(torch.randn(2, 1024, dtype=torch.bfloat16))
    assert _counted(model, "weight_dtype") == 1
    qkv.bfloat16()  # back to BF16: new storage, the packed copy stays unused
    with torch.no_grad():
        qkv.weight.mul_(-1)
        _qkv(reference).weight.mul_(-1)
        assert close(model(torch.arange(3)), reference(torch.arange(3)))
    # Which check fires depends on the allocator: the new BF16 storage may reuse
    # the address the original had before .float() freed it; then the version
    # counter or the fingerprint catches it instead of the pointer.
    stale = ("weight_storage_changed", "weight_mutated_in_place", "weight_content_changed")
    assert sum(_counted(model, reason) for reason in stale) == 1
    assert get_policy(model).counters.calls("qkv_proj", "packed") == 0


def _in_place(weight: torch.Tensor) -> None:
    with torch.no_grad():
        weight.mul_(2)


def test_in_place_mutation_result_follows_the_new_weight():
    model = make(layers=1)
    reference = copy.deepcopy(model)
    install_kernel_policy(model, EAGER)
    for m in (model, reference):
        _in_place(_qkv(m).weight)
    with torch.no_grad():
        assert close(model(torch.arange(4)), reference(torch.arange(4)))
    assert _counted(model, "weight_mutated_in_place") >= 1


def test_repack_restores_the_packed_route():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    invalidate_packed_weights(model)
    assert not packed_buffer_names(model)
    report = repack(model)
    assert len(report.packed) == 5
    policy = get_policy(model)
    policy.counters.reset()
    with torch.no_grad():
        model(torch.arange(2))
    assert policy.counters.calls(route="fallback") == 0 and policy.counters.calls(route="packed") == 5


def test_budget_packs_exactly_the_modules_that_fit():
    model = make(layers=1)
    reference = copy.deepcopy(model)
    # qkv 6 MiB, o 2 MiB, gate_up 8 MiB, down 4 MiB, lm_head 4 MiB (in order).
    report = install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed",
                                                       memory_budget_mib=12))
    assert [p for _, p, _ in report.packed] == ["qkv_proj", "o_proj", "down_proj"]
    assert [(p, why) for _, p, why in report.not_packed] == [("gate_up_proj", "not_packed_budget"),
                                                            ("lm_head", "not_packed_budget")]
    assert report.packed_bytes == 12 * MIB
    with torch.no_grad():
        assert close(model(torch.arange(3)), reference(torch.arange(3)))
    counters = get_policy(model).counters
    assert counters.calls("gate_up_proj", "row_major") == 1 and counters.calls("qkv_proj", "packed") == 1


def test_zero_budget_still_serves_row_major():
    model = make(layers=1)
    report = install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed",
                                                       memory_budget_mib=0))
    assert not report.packed and report.packed_bytes == 0
    with torch.no_grad():
        model(torch.arange(2))
    assert get_policy(model).counters.calls(route="packed") == 0


def test_installing_twice_is_an_error():
    model = make(layers=1)
    install_kernel_policy(model, EAGER)
    with pytest.raises(RuntimeError, match="already installed"):
        install_kernel_policy(model, EAGER)


def test_regional_compile_without_a_repeated_block_runs_eagerly_and_says_so():
    base = make(layers=1)
    routed = copy.deepcopy(base)
    report = install_kernel_policy(routed, KernelPolicyConfig.from_flag(memory_budget_mib=None, shape_gate="bucketed"))
    assert report.compile_mode == "eager"
    assert get_policy(routed).counters.calls("regional_compile", "fallback", "no_repeated_block") == 1
    with torch.no_grad():
        for m in (1, 3):
            assert close(routed(torch.arange(m)), base(torch.arange(m)))


def test_transformers_llama_with_and_without_policy():
    base = transformers_llama()
    routed = copy.deepcopy(base)
    report = install_kernel_policy(routed, EAGER)
    assert report.adapter == "transformers"
    assert routed.lm_head.weight is routed.model.embed_tokens.weight
    ids = torch.randint(0, 2048, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert close(routed(ids).logits, base(ids).logits)
        want = base.generate(ids, max_new_tokens=6, do_sample=False)
        got = routed.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, want)
    assert get_policy(routed).counters.calls(route="packed") > 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
