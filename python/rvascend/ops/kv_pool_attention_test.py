"""kv_pool_attention against torch's own SDPA and an FP64 reference; pool writes; errors."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from rvascend import ops


def make_case(lens, heads=16, kv_heads=8, d=128, slots=None, seed=0, dtype=torch.bfloat16):
    """lens: (new, total) per sequence. Returns the op's arguments and what SDPA needs."""
    g = torch.Generator().manual_seed(seed)
    total = sum(t for _, t in lens)
    num_slots = slots or total + 5
    perm = torch.randperm(num_slots, generator=g)[:total]
    k_pool = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    v_pool = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    t = sum(n for n, _ in lens)
    q = torch.randn(t, heads, d, generator=g).to(dtype)
    k_new = torch.randn(t, kv_heads, d, generator=g).to(dtype)
    v_new = torch.randn(t, kv_heads, d, generator=g).to(dtype)
    kv_starts, q_starts, write, start = [0], [0], [], 0
    for n, tot in lens:
        seq_slots = perm[start:start + tot]
        write.extend(seq_slots[tot - n:].tolist())
        start += tot
        kv_starts.append(start)
        q_starts.append(q_starts[-1] + n)
    return dict(q=q, k_pool=k_pool, v_pool=v_pool, k_new=k_new, v_new=v_new,
                write_slots=torch.tensor(write), kv_slots=perm.clone(), kv_starts=torch.tensor(kv_starts),
                q_starts=torch.tensor(q_starts), scale=d ** -0.5)


def sdpa_reference(a, dtype):
    """torch SDPA per sequence after writing the new K/V: the implementation no one here wrote."""
    k_pool, v_pool = a["k_pool"].clone(), a["v_pool"].clone()
    k_pool[a["write_slots"]] = a["k_new"]
    v_pool[a["write_slots"]] = a["v_new"]
    heads, kv_heads = a["q"].shape[1], k_pool.shape[1]
    outs = []
    for b in range(len(a["q_starts"]) - 1):
        q0, q1 = int(a["q_starts"][b]), int(a["q_starts"][b + 1])
        s = a["kv_slots"][int(a["kv_starts"][b]):int(a["kv_starts"][b + 1])]
        q = a["q"][q0:q1].to(dtype).transpose(0, 1)
        k = k_pool[s].to(dtype).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        v = v_pool[s].to(dtype).transpose(0, 1).repeat_interleave(heads // kv_heads, 0)
        n, length = q.shape[1], k.shape[1]
        mask = torch.arange(length)[None, :] <= (length - n + torch.arange(n))[:, None]
        outs.append(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=a["scale"]).transpose(0, 1))
    return torch.cat(outs), k_pool, v_pool


@pytest.mark.parametrize("lens,heads,kv_heads,d", [
    ([(1, 1)], 2, 1, 8),
    ([(1, 64)], 16, 8, 128),             # Qwen3-0.6B decode
    ([(1, 513), (1, 40)], 32, 8, 64),     # two sequences, GQA 4
    ([(4, 20), (16, 16), (1, 7)], 12, 2, 100),  # prefix + new rows, prefill from empty
])
def test_matches_fp64_and_torch_sdpa(lens, heads, kv_heads, d):
    a = make_case(lens, heads, kv_heads, d)
    want64, k_after, v_after = sdpa_reference(a, torch.float64)
    want_bf16, _, _ = sdpa_reference(a, torch.bfloat16)
    got = ops.kv_pool_attention(**a)
    assert torch.equal(a["k_pool"], k_after) and torch.equal(a["v_pool"], v_after)  # written in place
    err = (got.double() - want64).abs()
    # One BF16 rounding (2^-8 relative) plus FP32 arithmetic.
    assert (err <= want64.abs() * 2**-8 + 1e-3).all(), err.max()
    # At least as close to FP64 as torch's own BF16 SDPA.
    assert err.mean() <= (want_bf16.double() - want64).abs().mean() + 1e-6


def test_fp32_matches_fp64_and_torch_sdpa():
    # The FP32 form (FP32 models under deterministic inference): FP32 arithmetic, no BF16 rounding.
    a = make_case([(4, 20), (16, 16), (1, 513)], 12, 4, 64, dtype=torch.float32)
    want64, k_after, v_after = sdpa_reference(a, torch.float64)
    want32, _, _ = sdpa_reference(a, torch.float32)
    got = ops.kv_pool_attention(**a)
    assert got.dtype == torch.float32
    assert torch.equal(a["k_pool"], k_after) and torch.equal(a["v_pool"], v_after)
    err = (got.double() - want64).abs()
    assert (err <= want64.abs() * 1e-5 + 1e-5).all(), err.max()
    assert err.max() <= 4 * (want32.double() - want64).abs().max() + 1e-6


def test_fp32_rows_do_not_depend_on_their_batch():
    # One sequence of 24 rows over 40 slots: alone, beside two others, and in three chunks
    # (each chunk's earlier rows already in the pool) give the same bits.
    heads, kv_heads, d = 8, 2, 64
    alone = make_case([(24, 40)], heads, kv_heads, d, seed=3, dtype=torch.float32)
    want = ops.kv_pool_attention(**{**alone, "k_pool": alone["k_pool"].clone(), "v_pool": alone["v_pool"].clone()})
    others = make_case([(3, 9), (5, 30)], heads, kv_heads, d, seed=4, dtype=torch.float32)
    slots = alone["k_pool"].shape[0]
    batched = dict(others)
    for pool in ("k_pool", "v_pool"):
        batched[pool] = torch.cat([alone[pool], others[pool]])
    batched["q"] = torch.cat([others["q"][:3], alone["q"], others["q"][3:]])
    for new in ("k_new", "v_new"):
        batched[new] = torch.cat([others[new][:3], alone[new], others[new][3:]])
    shift = lambda t: t + slots  # noqa: E731
    o_slots, o_kv = others["kv_slots"], others["kv_starts"]
    batched["kv_slots"] = torch.cat([shift(o_slots[:9]), alone["kv_slots"], shift(o_slots[9:39])])
    batched["write_slots"] = torch.cat([shift(others["write_slots"][:3]), alone["write_slots"],
                                        shift(others["write_slots"][3:])])
    batched["kv_starts"] = torch.tensor([0, 9, 49, 79])
    batched["q_starts"] = torch.tensor([0, 3, 27, 32])
    assert o_kv.tolist() == [0, 9, 39]
    got = ops.kv_pool_attention(**batched)
    assert torch.equal(got[3:27], want)
    chunked = {**alone, "k_pool": alone["k_pool"].clone(), "v_pool": alone["v_pool"].clone()}
    rows, start = [], 0
    for n in (7, 1, 16):
        end = 40 - 24 + start + n
        rows.append(ops.kv_pool_attention(
            **{**chunked, "q": alone["q"][start:start + n], "k_new": alone["k_new"][start:start + n],
               "v_new": alone["v_new"][start:start + n], "write_slots": alone["write_slots"][start:start + n],
               "kv_slots": alone["kv_slots"][:end], "kv_starts": torch.tensor([0, end]),
               "q_starts": torch.tensor([0, n])}))
        start += n
    assert torch.equal(torch.cat(rows), want)


def test_only_write_slots_change_in_the_pool():
    a = make_case([(2, 10)], slots=64)
    before_k = a["k_pool"].clone()
    ops.kv_pool_attention(**a)
    changed = (a["k_pool"] != before_k).flatten(1).any(1).nonzero().flatten().tolist()
    assert set(changed) <= set(a["write_slots"].tolist())


def test_traces_under_torch_compile():
    a = make_case([(1, 9)], heads=4, kv_heads=2, d=16)
    want = ops.kv_pool_attention(**{**a, "k_pool": a["k_pool"].clone(), "v_pool": a["v_pool"].clone()})
    fn = torch.compile(lambda **kw: ops.kv_pool_attention(**kw), fullgraph=True, backend="aot_eager")
    assert torch.equal(fn(**a), want)


@pytest.mark.parametrize("change,error,match", [
    (lambda a: a.update(q=a["q"].half()), TypeError, "q must be bfloat16 or float32"),
    (lambda a: a.update(q=a["q"].float()), TypeError, "k_pool must be torch.float32 like q"),
    (lambda a: a.update(kv_slots=a["kv_slots"].int()), TypeError, "kv_slots must be a 1-D int64"),
    (lambda a: a["kv_slots"].__setitem__(0, 10**6), ValueError, "outside the KV pool"),
    (lambda a: a["write_slots"].__setitem__(0, -3), ValueError, "write_slots\\[0\\] = -3"),
    (lambda a: a.update(q_starts=torch.tensor([0, 5])), ValueError, "q_starts ends at 5"),
    (lambda a: a.update(kv_starts=torch.tensor([0, 0]), kv_slots=torch.zeros(0, dtype=torch.long)), ValueError,
     "1 query rows but only 0"),
    (lambda a: a.update(k_new=a["k_new"][:, :1]), ValueError, "k_new has shape"),
])
def test_bad_input_is_a_clear_error_and_leaves_the_pool_alone(change, error, match):
    a = make_case([(1, 4)], heads=4, kv_heads=2, d=8)
    change(a)
    before = a["k_pool"].clone()
    with pytest.raises(error, match=match):
        ops.kv_pool_attention(**a)
    assert torch.equal(a["k_pool"], before)



def test_native_entry_point_checks_every_extent():
    """Buffers cross into C++ with their element counts; a count short of what the
    call reads or writes is an error before anything is written."""
    from rvascend.ops.packed_linear import _native

    heads, kv_heads, d, slots = 4, 2, 64, 32
    q = torch.randn(3, heads * d).bfloat16()
    k_pool, v_pool = torch.randn(slots, kv_heads, d).bfloat16(), torch.randn(slots, kv_heads, d).bfloat16()
    k_new, v_new = torch.randn(3, kv_heads, d).bfloat16(), torch.randn(3, kv_heads, d).bfloat16()
    write, kv_slots = torch.tensor([5, 6, 7]), torch.tensor([0, 1, 2, 5, 6, 7])
    kv_starts, q_starts, out = torch.tensor([0, 6]), torch.tensor([0, 3]), torch.empty_like(q)
    args = dict(kernel="", batch=1, q_starts=q_starts.data_ptr(), q_starts_n=2, q_rows=3,
                kv_starts=kv_starts.data_ptr(), kv_starts_n=2, kv_slots=kv_slots.data_ptr(), n_kv_slots=6,
                heads=heads, kv_heads=kv_heads, head_dim=d, q=q.data_ptr(), q_stride=heads * d, q_elements=q.numel(),
                k_pool=k_pool.data_ptr(), v_pool=v_pool.data_ptr(), num_slots=slots, pool_elements=k_pool.numel(),
                k_new=k_new.data_ptr(), v_new=v_new.data_ptr(), new_elements=k_new.numel(),
                write_slots=write.data_ptr(), n_write=3, scale=0.125, out=out.data_ptr(), out_stride=heads * d,
                out_elements=out.numel(), num_threads=1)
    _native.kv_pool_attention(**args)
    for change, message in ((dict(q_elements=q.numel() - 1), "q has"), (dict(pool_elements=64), "k_pool has"),
                            (dict(num_slots=slots + 1), "k_pool has"), (dict(new_elements=10), "k_new has"),
                            (dict(out_elements=5), "out has"), (dict(kv_starts_n=1), "kv_starts has")):
        before = k_pool.clone()
        with pytest.raises(ValueError, match=message):
            _native.kv_pool_attention(**{**args, **change})
        assert torch.equal(before, k_pool), change


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
