"""recurrent_gated_delta_rule: the CPU op and the AscendC kernel on the CPU twin
against an FP64 reference and against transformers' torch_recurrent_gated_delta_rule."""

from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import rvascend.ops.recurrent_gated_delta_rule as R
from rvascend.ops.recurrent_gated_delta_rule_reference import reference

# Upstream golden tolerances; >= 99.5 % of elements must be within them.
TOL = {torch.bfloat16: (2.0 ** -7, 1e-4), torch.float16: (5e-3, 2.5e-5), torch.float32: (1e-5, 1e-6)}


def within(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype, fraction: float = 0.995) -> bool:
    rtol, atol = TOL[dtype]
    # Outputs are rounded once to `dtype`: allow that rounding on top of the golden tolerance.
    ok = (got.double() - want).abs() <= atol + rtol * want.abs() + _ulp(want, dtype)
    return ok.double().mean().item() >= fraction


def _ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    bits = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24}[dtype]
    return torch.exp2(torch.floor(torch.log2(x.abs().clamp_min(1e-30))) - bits + 1)


def make(dtype=torch.bfloat16, lens=(1, 3, 0, 8), nk=2, nv=4, dk=72, dv=40, slots=None, g=True, gk=None,
         accepted=None, index_dtype=torch.int32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    T = sum(max(n, 0) for n in lens)
    slots = slots or T + 3
    q = torch.nn.functional.normalize(torch.randn(T, nk, dk, generator=gen), dim=-1).to(dtype)
    k = torch.nn.functional.normalize(torch.randn(T, nk, dk, generator=gen), dim=-1).to(dtype)
    v = torch.randn(T, nv, dv, generator=gen).to(dtype)
    beta = torch.rand(T, nv, generator=gen).to(dtype)
    state = (torch.randn(slots, nv, dv, dk, generator=gen) * 0.1).to(dtype)
    perm = torch.randperm(slots, generator=gen)[:T]
    args = dict(query=q, key=k, value=v, state=state, beta=beta, scale=dk ** -0.5,
                actual_seq_lengths=torch.tensor(lens, dtype=index_dtype), ssm_state_indices=perm.to(index_dtype),
                num_accepted_tokens=None if accepted is None else torch.tensor(accepted, dtype=torch.int32),
                g=-torch.rand(T, nv, generator=gen) * 0.5 if g else None,
                gk=None if gk is None else (-torch.rand(T, nv, generator=gen) * 0.3 if gk == "head"
                                           else -torch.rand(T, nv, dk, generator=gen) * 0.3))
    return args


def run_op(args):
    state = args["state"].clone()
    out = R.recurrent_gated_delta_rule(**{**args, "state": state})
    return out, state


def run_twin(args, **kw):
    state = args["state"].clone()
    out, counters, plan = R.run_on_twin(**{**args, "state": state}, **kw)
    return out, state, counters, plan


CASES = [
    dict(dtype=torch.bfloat16), dict(dtype=torch.float16),
    dict(dk=16, dv=16, nk=1, nv=1), dict(dk=64, dv=64, nk=2, nv=4), dict(dk=128, dv=128, nk=4, nv=8, lens=(1, 2)),
    dict(dk=200, dv=72, nk=1, nv=2, lens=(2,)), dict(dk=72, dv=200, nk=1, nv=2, lens=(1,)),
    dict(nk=16, nv=32, dk=16, dv=16, lens=(1, 1)),
    dict(g=False), dict(gk="head"), dict(gk="dim"), dict(g=False, gk="dim"), dict(gk="head", g=True),
    dict(index_dtype=torch.int64), dict(accepted=[1, 3, 0, 8]), dict(accepted=[0, 0, 0, 0]),
    dict(accepted=[1, 4, 1, 9]), dict(accepted=[1, 2, 5, 3]),
    dict(lens=(8, 8, 8)), dict(lens=(0, 0, 1)), dict(lens=(5, 0, 2, 7, 1)),
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_cpu_op_matches_fp64_reference(case):
    args = make(**case)
    out, state = run_op(args)
    want_out, want_state = reference(**args)
    dtype = args["query"].dtype
    assert within(out, want_out, dtype)
    assert within(state, want_state, dtype)


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_kernel_on_twin_matches_fp64_reference_and_cpu_op(case):
    args = make(**case)
    out, state, counters, plan = run_twin(args)
    want_out, want_state = reference(**args)
    dtype = args["query"].dtype
    assert within(out, want_out, dtype) and within(state, want_state, dtype)
    cpu_out, cpu_state = run_op(args)
    assert within(out, cpu_out.double(), dtype) and within(state, cpu_state.double(), dtype)
    assert counters["peak_ub_bytes"] <= plan["planned_ub_bytes"] <= plan["ubTotalBytes"]


@pytest.mark.parametrize("platform", sorted(R.PLATFORMS))
def test_untouched_slots_are_bit_identical_and_each_token_writes_its_slot(platform):
    args = make(lens=(3, 2), slots=12)
    for runner in (run_op, lambda a: run_twin(a, platform=platform)[:2]):
        out, state = runner(args)
        written = set(args["ssm_state_indices"].tolist())
        for s in range(12):
            if s not in written:
                assert torch.equal(state[s], args["state"][s])
        # Token t's slot holds the state after token t: the reference agrees slot by slot.
        _, want = reference(**args)
        for s in written:
            assert within(state[s], want[s], torch.bfloat16)


def test_agrees_with_transformers_torch_recurrent_gated_delta_rule():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as hf
    B, NK, NV, Dk, Dv, steps = 2, 2, 4, 64, 48, 4
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, steps, NK, Dk, generator=gen)
    k = torch.randn(B, steps, NK, Dk, generator=gen)
    v = torch.randn(B, steps, NV, Dv, generator=gen)
    beta = torch.rand(B, steps, NV, generator=gen)
    g = -torch.rand(B, steps, NV, generator=gen)
    init = torch.randn(B, NV, Dk, Dv, generator=gen) * 0.1
    want, want_state = hf(q, k, v, g=g, beta=beta, initial_state=init, output_final_state=True,
                          use_qk_l2norm_in_kernel=True)
    # The same recurrence one decode token at a time through the op (q/k
    # normalised by the caller, as the op contract says).
    qn = torch.nn.functional.normalize(q, dim=-1, eps=1e-6)
    kn = torch.nn.functional.normalize(k, dim=-1, eps=1e-6)
    for dtype in (torch.float32, torch.bfloat16):
        pool = init.transpose(-1, -2).contiguous().to(dtype)  # [B, NV, Dv, Dk]
        outs = []
        for t in range(steps):
            outs.append(R.recurrent_gated_delta_rule(
                qn[:, t].to(dtype), kn[:, t].to(dtype), v[:, t].to(dtype), pool, beta[:, t].to(dtype), Dk ** -0.5,
                torch.ones(B, dtype=torch.int32), torch.arange(B, dtype=torch.int32), g=g[:, t].contiguous()))
        got = torch.stack(outs, dim=1)
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
        assert torch.allclose(pool.float().transpose(-1, -2), want_state.float(), atol=tol, rtol=tol)


def test_prompt_form_agrees_with_transformers_and_writes_only_each_sequences_slot():
    """Prompts longer than MAX_MTP through the recurrence: outputs and final states those of
    transformers' torch_recurrent_gated_delta_rule; every other slot bit-identical."""
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import torch_recurrent_gated_delta_rule as hf
    NK, NV, Dk, Dv, lens, slots = 2, 4, 64, 48, (21, 9), (3, 0)
    gen = torch.Generator().manual_seed(5)
    pool = torch.randn(5, NV, Dv, Dk, generator=gen) * 0.1
    before = pool.clone()
    qs, ks, vs, betas, gs, want_out = [], [], [], [], [], []
    for n, slot in zip(lens, slots):
        q, k = torch.randn(1, n, NK, Dk, generator=gen), torch.randn(1, n, NK, Dk, generator=gen)
        v, beta, g = torch.randn(1, n, NV, Dv, generator=gen), torch.rand(1, n, NV, generator=gen), \
            -torch.rand(1, n, NV, generator=gen)
        out, state = hf(q, k, v, g=g, beta=beta, initial_state=before[slot:slot + 1].transpose(-1, -2),
                        output_final_state=True, use_qk_l2norm_in_kernel=True)
        want_out.append(out[0])
        qs.append(torch.nn.functional.normalize(q[0], dim=-1, eps=1e-6))
        ks.append(torch.nn.functional.normalize(k[0], dim=-1, eps=1e-6))
        vs.append(v[0]), betas.append(beta[0]), gs.append(g[0])
        assert n > R.MAX_MTP
        with pytest.raises(ValueError, match="exceeds MAX_MTP"):  # the decode form refuses it
            R.validate(qs[-1], ks[-1], v[0], pool, beta[0], torch.tensor([n]), torch.full((n,), slot), None, g[0],
                       None)
        want_state = state[0].transpose(-1, -2)
        if slot == 3:
            want_state_3 = want_state
        else:
            want_state_0 = want_state
    got = R.gated_delta_rule_prompts(torch.cat(qs), torch.cat(ks), torch.cat(vs), pool, torch.cat(betas),
                                     torch.cat(gs), torch.tensor(lens), torch.tensor(slots), scale=Dk ** -0.5)
    torch.testing.assert_close(got, torch.cat(want_out), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[3], want_state_3, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool[0], want_state_0, atol=1e-4, rtol=1e-4)
    assert torch.equal(pool[[1, 2, 4]], before[[1, 2, 4]])
    with pytest.raises(ValueError, match="distinct state slots"):
        R.gated_delta_rule_prompts(torch.cat(qs), torch.cat(ks), torch.cat(vs), pool, torch.cat(betas),
                                   torch.cat(gs), torch.tensor(lens), torch.tensor([2, 2]))


def _bad(name, **change):
    def build():
        args = make(lens=(1, 2))
        args.update({k: v(args) if callable(v) else v for k, v in change.items()})
        return args
    return pytest.param(build, id=name)


@pytest.mark.parametrize("build,error,match", [
    (_bad("mtp9", actual_seq_lengths=torch.tensor([9], dtype=torch.int32)).values[0], ValueError, "exceeds MAX_MTP"),
    (_bad("sum", actual_seq_lengths=torch.tensor([1, 1], dtype=torch.int32)).values[0], ValueError, "add up to"),
    (_bad("slot", ssm_state_indices=lambda a: torch.tensor([0, 1, 99], dtype=torch.int32)).values[0], ValueError,
     r"ssm_state_indices\[2\] = 99 is outside the state pool"),
    (_bad("shared", ssm_state_indices=lambda a: torch.tensor([4, 5, 4], dtype=torch.int32)).values[0], ValueError,
     "slot 4 belongs to sequence 0 and to sequence 1"),
    (_bad("int64", ssm_state_indices=lambda a: torch.tensor([0, 1, 2**40], dtype=torch.int64)).values[0], ValueError,
     "does not fit in int32"),
    (_bad("gqa", key=lambda a: a["key"][:, :1].repeat(1, 3, 1), query=lambda a: a["query"][:, :1].repeat(1, 3, 1)
          ).values[0], ValueError, "not a multiple of NK"),
    (_bad("dtype", beta=lambda a: a["beta"].float()).values[0], TypeError, "beta is torch.float32"),
    (_bad("g", g=lambda a: a["g"].bfloat16()).values[0], TypeError, "g must be float32"),
    (_bad("dk", query=lambda a: torch.zeros(3, 2, 600, dtype=torch.bfloat16),
          key=lambda a: torch.zeros(3, 2, 600, dtype=torch.bfloat16)).values[0], ValueError, "head dims"),
    (_bad("state", state=lambda a: a["state"][:, :, :, :10]).values[0], ValueError, "state has shape"),
])
def test_validation_errors_are_raised_before_the_state_is_touched(build, error, match):
    args = build()
    before = args["state"].clone()
    with pytest.raises(error, match=match):
        R.recurrent_gated_delta_rule(**args)
    assert torch.equal(args["state"], before)


def test_fp32_inputs_run_on_cpu_but_not_on_the_kernel():
    args = make(dtype=torch.float32)
    out, _ = run_op(args)
    assert within(out, reference(**args)[0], torch.float32)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        run_twin(args)


def test_torch_compile_with_fake_implementation():
    args = make(lens=(1, 1))

    def step(q, state):
        return R.recurrent_gated_delta_rule(q, args["key"], args["value"], state, args["beta"], 0.1,
                                            args["actual_seq_lengths"], args["ssm_state_indices"], g=args["g"]) * 2

    s1, s2 = args["state"].clone(), args["state"].clone()
    got = torch.compile(step, fullgraph=True)(args["query"], s1)
    assert torch.equal(got, step(args["query"], s2)) and torch.equal(s1, s2)


def test_host_tiling_refuses_more_tokens_than_max_mtp_per_sequence():
    args = make(lens=(8, 1))  # T = 9 tokens
    with pytest.raises(ValueError, match="T = 9 tokens in B = 1 sequences: .* more than MAX_MTP = 8"):
        R.tiling(args["query"], args["value"], args["state"], 1, has_g=True, gk=None, has_accepted=False,
                 seq_lens_int64=False, indices_int64=False, scale=0.1)
    R.tiling(args["query"], args["value"], args["state"], 2, has_g=True, gk=None, has_accepted=False,
             seq_lens_int64=False, indices_int64=False, scale=0.1)  # 9 tokens in 2 sequences can fit


def test_kernel_given_a_length_past_max_mtp_skips_it_without_writing_out_of_bounds():
    """What an aclnn caller could pass past the host checks: lengths [9, 0] for T = 9 in B = 2.
    The twin flags any UB overflow or out-of-bounds DMA; the kernel must skip that sequence."""
    args = make(lens=(8, 1))
    plan = R.tiling(args["query"], args["value"], args["state"], 2, has_g=True, gk=None, has_accepted=False,
                    seq_lens_int64=False, indices_int64=False, scale=args["scale"])
    state = args["state"].clone()
    shapes = {"t": 9, "b": 2, "nk": 2, "nv": 4, "dk": 72, "dv": 40, "num_slots": state.shape[0]}
    out = torch.zeros((9, 4, 40), dtype=torch.bfloat16)
    lengths = torch.tensor([9, 0], dtype=torch.int32)
    spec, _keep = R._spec(shapes, args["query"], args["key"], args["value"], state, args["beta"], args["scale"],
                          lengths, args["ssm_state_indices"], None, args["g"], None, out)
    R._native.run_twin(spec, plan, R.DEFAULT_SOC)
    assert torch.equal(state, args["state"]) and not out.any()


def test_twin_takes_ub_from_the_soc_not_from_the_tiling(monkeypatch):
    """A tiling planned for a 1 MiB UB runs into the 910B's 192 KiB on the twin."""
    args = make(lens=(1,), nk=1, nv=1, dk=512, dv=512, slots=2)
    monkeypatch.setitem(R.PLATFORMS, "HypotheticalBigUb", (1 << 20, 40))
    plan = R.tiling(args["query"], args["value"], args["state"], 1, has_g=True, gk=None, has_accepted=False,
                    seq_lens_int64=False, indices_int64=False, scale=0.1, platform="HypotheticalBigUb")
    assert plan["planned_ub_bytes"] > R.PLATFORMS[R.DEFAULT_SOC][0]
    with pytest.raises(R.TwinError, match="UB overflow"):
        run_twin(args, tiling_override=plan)
    run_twin(args)  # the tiling for the SoC itself fits


def test_unknown_soc_is_refused_by_name():
    args = make(lens=(1,))
    with pytest.raises(ValueError, match="unknown SoC 'Ascend310P3'"):
        run_twin(args, platform="Ascend310P3")


def test_tiling_for_each_soc_runs_on_that_socs_twin():
    for soc, (ub, cores) in R.PLATFORMS.items():
        args = make(lens=(1, 2), dk=128, dv=128, nk=2, nv=4)
        _, _, counters, plan = run_twin(args, platform=soc)
        assert plan["ubTotalBytes"] == ub and counters["peak_ub_bytes"] <= ub
        assert plan["blockDim"] <= cores


def test_twin_dma_is_the_minimum_for_single_token_decode():
    args = make(lens=(1,) * 8, nk=4, nv=8, dk=128, dv=128, slots=8)
    _, _, counters, _ = run_twin(args)
    T, nk, nv, dk, dv, e = 8, 4, 8, 128, 128, 2
    state = T * nv * dv * dk * e
    minimum_in = state + T * (2 * nk * dk + nv * dv + nv) * e + T * nv * 4  # state, q, k, v, beta, g
    minimum_out = state + T * nv * dv * e                                    # state, out
    # q and k rows are re-read for each value head that shares them (GQA).
    assert counters["dma_out_bytes"] == minimum_out
    assert counters["dma_in_bytes"] / minimum_in <= 1.1


@settings(max_examples=200, deadline=None)
@given(dk=st.integers(1, 512), dv=st.integers(1, 512), nv=st.sampled_from([1, 2, 4, 8, 16, 32, 64, 128, 256]),
       g=st.booleans(), gk=st.sampled_from([None, "head", "dim"]), platform=st.sampled_from(sorted(R.PLATFORMS)))
def test_tiling_fits_ub_for_every_supported_shape(dk, dv, nv, g, gk, platform):
    q = torch.empty(1, 1, dk, dtype=torch.bfloat16)
    v = torch.empty(1, nv, dv, dtype=torch.bfloat16)
    gk_t = None if gk is None else torch.empty((1, nv) if gk == "head" else (1, nv, dk))
    plan = R.tiling(q, v, torch.empty(4, nv, dv, dk), 1, has_g=g, gk=gk_t, has_accepted=True,
                    seq_lens_int64=False, indices_int64=True, scale=1.0, platform=platform)
    assert plan["planned_ub_bytes"] <= plan["ubTotalBytes"]
    assert plan["vStep"] % 16 == 0 and plan["vStep"] >= 16
    assert plan["chunks"] == -(-dv // plan["vStep"])
    assert plan["blockDim"] == min(nv, R.PLATFORMS[platform][1])


@settings(max_examples=12, deadline=None)
@given(dk=st.integers(1, 512), dv=st.integers(1, 300), gk=st.sampled_from([None, "head", "dim"]))
def test_twin_uses_no_more_ub_than_the_tiling_planned(dk, dv, gk):
    args = make(lens=(1,), nk=1, nv=1, dk=dk, dv=dv, gk=gk, slots=2)
    _, _, counters, plan = run_twin(args)
    assert counters["peak_ub_bytes"] == plan["planned_ub_bytes"] <= plan["ubTotalBytes"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
