"""--cpu-kernels-drop-unpacked: the packed copy is the weight (route.py, ProjectionRoute.take_weight)."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F

from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy, invalidate_packed_weights, repack
from rvascend.dispatch import weights_generation
from rvascend.ops.testing import pack_reference
from rvascend.policy.testing import make, transformers_llama
from rvascend.dispatch.route import PACKED_BUFFER

KEEP = KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed")
DROP = KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed", drop_unpacked=True)
PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _pair(tie: bool):
    keep = make(tie=tie)
    drop = copy.deepcopy(keep)
    install_kernel_policy(keep, KEEP)
    install_kernel_policy(drop, DROP)
    return keep, drop


def _parameter_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


@pytest.mark.parametrize("tie", [True, False])
def test_the_row_major_weights_are_gone_and_the_logits_are_bit_identical(tie):
    keep, drop = _pair(tie)
    names = {n for n, _ in drop.named_parameters()}
    assert not any(n.endswith(p + ".weight") for n in names for p in PROJECTIONS)
    # Tied, the lm_head is the embedding: its packed copy serves the lookups too.
    assert ("model.embed_tokens.weight" in names) == (not tie) and "lm_head.weight" not in names
    dropped = _parameter_bytes(keep) - _parameter_bytes(drop)
    assert dropped == sum(m.weight.numel() * 2 for n, m in keep.named_modules()
                          if n.endswith(PROJECTIONS) or m is keep.lm_head)
    with pytest.raises(AttributeError, match="weight"):
        drop.model.layers[0].mlp.down_proj.weight
    for rows in (1, 3, 9):  # row counts the seed's gate packs everywhere (40 rows of lm_head it does not)
        ids = torch.arange(rows) * 7 % 2048
        with torch.no_grad():
            assert torch.equal(drop(ids), keep(ids)), rows
    assert (drop.lm_head is drop.model.embed_tokens) == tie
    assert get_policy(drop).routes["lm_head"].owned is not None


def test_embedding_lookups_from_the_packed_copy_match_and_check_their_ids():
    keep, drop = _pair(tie=True)
    ids = torch.tensor([[0, 31, 32, 33, 2047], [5, 1024, 1023, 64, 63]])
    assert torch.equal(drop.model.embed_tokens(ids), keep.model.embed_tokens(ids))
    assert torch.equal(drop.model.embed_tokens(ids.int()), keep.model.embed_tokens(ids))
    route = get_policy(drop).routes["lm_head"]
    for b in (64, 128, 256):  # layout version 2's lanes, at every wide block
        w = keep.model.embed_tokens.weight.detach()
        packed = pack_reference(w, 2, b)
        saved = drop.model.embed_tokens._buffers[PACKED_BUFFER], route.owned
        drop.model.embed_tokens._buffers[PACKED_BUFFER] = packed
        route.owned = dataclasses.replace(route.owned, layout_version=2)
        try:
            assert torch.equal(route.embedding_rows(ids), F.embedding(ids, w)), b
        finally:
            drop.model.embed_tokens._buffers[PACKED_BUFFER], route.owned = saved
    with pytest.raises(IndexError, match=r"token id out of range \[0, 2048\): got 2048"):
        drop.model.embed_tokens(torch.tensor([3, 2048]))
    with pytest.raises(IndexError, match="got -1"):
        drop.model.embed_tokens(torch.tensor([-1]))
    with pytest.raises(TypeError, match="int64 or int32"):
        drop.model.embed_tokens(torch.tensor([1.0]))


def test_packed_rows_reads_every_layout_and_checks_ids_and_extents():
    """The native gather behind those lookups, at layout version 1 and version 2's every
    block (whatever this host packs), against the row-major weight."""
    from rvascend.ops.packed_linear import _native

    torch.manual_seed(0)
    w = torch.randn(300, 40).bfloat16()
    ids = torch.tensor([0, 31, 32, 63, 64, 299, 150, 0, 255, 256])
    out = torch.empty(len(ids), 40, dtype=torch.bfloat16)
    for version, b in ((1, 32), (2, 64), (2, 128), (2, 256), (2, 512)):
        packed = pack_reference(w, version, b)
        args = dict(packed=packed.data_ptr(), packed_elements=packed.numel(), n=300, k=40, block_n=b,
                    ids=ids.data_ptr(), count=len(ids), out=out.data_ptr(), out_elements=out.numel())
        out.zero_()
        _native.packed_rows(**args)
        assert torch.equal(out, w[ids]), b
        with pytest.raises(ValueError, match="packed weight has"):
            _native.packed_rows(**{**args, "packed_elements": packed.numel() - 1})
        with pytest.raises(ValueError, match="out has"):
            _native.packed_rows(**{**args, "out_elements": out.numel() - 1})
        bad = torch.tensor([5, 300])
        out.zero_()
        with pytest.raises(IndexError, match=r"token id out of range \[0, 300\): got 300"):
            _native.packed_rows(**{**args, "ids": bad.data_ptr(), "count": 2})
        assert not out.any()  # checked before anything is written


def test_a_transformers_lm_head_tied_by_weight_keeps_both_copies():
    keep = transformers_llama()
    drop = copy.deepcopy(keep)
    install_kernel_policy(keep, KEEP)
    install_kernel_policy(drop, DROP)
    assert drop.lm_head.weight is drop.model.embed_tokens.weight
    assert get_policy(drop).routes["lm_head"].owned is None
    assert "weight" not in drop.model.layers[0].mlp.down_proj._parameters
    ids = torch.randint(0, 2048, (1, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(drop(ids).logits, keep(ids).logits)
        want = keep.generate(ids, max_new_tokens=4, do_sample=False)
        assert torch.equal(drop.generate(ids, max_new_tokens=4, do_sample=False), want)
    assert set(drop.state_dict()) == set(keep.state_dict())


def test_rows_the_gate_sends_to_f_linear_still_run_the_packed_kernel():
    keep, drop = _pair(tie=False)
    ids = torch.arange(200) % 2048  # past the seed's 128-row buckets: F.linear in the keep mode
    with torch.no_grad():
        want, got = keep(ids), drop(ids)
    assert torch.allclose(got.float(), want.float(), rtol=3e-2, atol=3e-2 * want.float().abs().max().item())
    counters = get_policy(drop).counters
    assert counters.calls("down_proj", "packed") == 2 and counters.calls("down_proj", "fallback") == 0
    assert get_policy(keep).counters.calls("down_proj", "fallback") == 2


def test_state_dict_unpacks_exactly_under_the_original_keys():
    keep, drop = _pair(tie=False)
    want, got = keep.state_dict(), drop.state_dict()
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key], value), key


def test_reload_packs_the_loaded_weights_and_declares_them_changed():
    keep, drop = _pair(tie=False)
    other = make(tie=False)
    with torch.no_grad():
        for p in other.parameters():
            p.mul_(-1.5)
    generation = weights_generation.current(drop)
    buffer = drop.model.layers[0].mlp.down_proj._buffers[PACKED_BUFFER]
    drop.load_state_dict(other.state_dict())
    keep.load_state_dict(other.state_dict())
    repack(keep)
    assert weights_generation.current(drop) > generation
    assert drop.model.layers[0].mlp.down_proj._buffers[PACKED_BUFFER] is not buffer
    for key, value in other.state_dict().items():
        assert torch.equal(drop.state_dict()[key], value), key
    ids = torch.arange(5)
    with torch.no_grad():
        assert torch.equal(drop(ids), keep(ids))
    counters = get_policy(drop).counters
    assert counters.calls("qkv_proj", "fallback") == 0 and counters.calls("qkv_proj", "row_major") == 0


def test_reload_refuses_a_missing_key_or_a_wrong_shape_by_name():
    _, drop = _pair(tie=False)
    state = drop.state_dict()
    before = drop.state_dict()["model.layers.0.mlp.down_proj.weight"]
    missing = {k: v for k, v in state.items() if k != "model.layers.1.self_attn.o_proj.weight"}
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*model\.layers\.1\.self_attn\.o_proj\.weight"):
        drop.load_state_dict(missing)
    drop.load_state_dict(missing, strict=False)
    bad = dict(state)
    bad["model.layers.0.mlp.down_proj.weight"] = torch.zeros(3, 3, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"size mismatch for model\.layers\.0\.mlp\.down_proj\.weight.*"
                                           r"packed weight of record has shape \(1024, 2048\)"):
        drop.load_state_dict(bad)
    assert torch.equal(drop.state_dict()["model.layers.0.mlp.down_proj.weight"], before)


@pytest.mark.parametrize("tie", [True, False])
def test_invalidate_and_repack_keep_the_weight_of_record(tie):
    keep, drop = _pair(tie)
    generation = weights_generation.current(drop)
    buffers = {n: b for n, b in drop.named_buffers() if n.endswith(PACKED_BUFFER)}
    invalidate_packed_weights(drop)
    assert weights_generation.current(drop) > generation  # cached K/V is still dropped
    ids = torch.arange(3)
    counters = get_policy(drop).counters
    counters.reset()
    with torch.no_grad():
        want = keep(ids)
        # Nothing to re-derive: every projection still runs packed, on the same buffers.
        assert torch.equal(drop(ids), want)
    assert counters.calls(route="fallback") == 0 and counters.calls(route="row_major") == 0
    assert counters.calls("down_proj", "packed") == 2 and counters.calls("lm_head", "packed") == 1
    report = repack(drop)
    assert {p for _, p, _ in report.packed} == {"lm_head", *PROJECTIONS}
    assert all(b is buffers[n] for n, b in drop.named_buffers() if n.endswith(PACKED_BUFFER))
    with torch.no_grad():
        assert torch.equal(drop(ids), want)


def test_calls_no_packed_kernel_takes_run_f_linear_on_an_unpacked_copy():
    keep, drop = _pair(tie=False)
    layer = drop.model.layers[0].mlp.down_proj
    weight = keep.model.layers[0].mlp.down_proj.weight.detach()
    x = torch.randn(2, 2048, requires_grad=True).bfloat16()
    with torch.enable_grad():
        out = layer(x)
        out.float().sum().backward()
    assert torch.equal(out.detach(), F.linear(x.detach(), weight))
    assert get_policy(drop).counters.calls("down_proj", "fallback") == 1
    with pytest.raises(RuntimeError, match="dtype"):  # as F.linear with a BF16 weight says
        layer(torch.randn(1, 2048))


def test_a_failed_install_gives_every_weight_back(monkeypatch):
    model = make(tie=False, layers=1)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from rvascend.dispatch import route as route_module

    taken = []
    own = route_module.ProjectionRoute._own

    def fail_third(self, *args):
        if len(taken) == 2:
            raise MemoryError("simulated")
        taken.append(self.name)
        own(self, *args)
    monkeypatch.setattr(route_module.ProjectionRoute, "_own", fail_third)
    with pytest.raises(MemoryError):
        install_kernel_policy(model, DROP)
    assert get_policy(model) is None
    after = model.state_dict()
    assert set(after) == set(before) and all(torch.equal(after[k], v) for k, v in before.items())
    assert all(isinstance(m.weight, torch.nn.Parameter) for n, m in model.named_modules() if n.endswith(PROJECTIONS))
    assert not any(m._state_dict_hooks or m._load_state_dict_pre_hooks for m in model.modules())


def test_drop_unpacked_needs_packed_weights():
    with pytest.raises(ValueError, match="drop_unpacked .* needs packed_weights"):
        install_kernel_policy(make(layers=1), KernelPolicyConfig(compile_mode="eager", packed_weights=False,
                                                           drop_unpacked=True))


def test_compiled_calls_reach_the_packed_weight_of_record():
    torch._dynamo.reset()
    keep, drop = _pair(tie=False)
    compiled = torch.compile(drop, backend="eager", fullgraph=True)
    counters = get_policy(drop).counters
    counters.reset()
    ids = torch.arange(4)
    with torch.no_grad():
        assert torch.equal(compiled(ids), keep(ids))
    assert counters.calls("down_proj", "packed") == 2 and counters.calls("lm_head", "packed") == 1
    # A reload reaches the compiled graph's next call.
    state = {k: -v for k, v in keep.state_dict().items()}
    drop.load_state_dict(state)
    keep.load_state_dict(state)
    repack(keep)
    with torch.no_grad():
        assert torch.equal(compiled(ids), keep(ids))


def test_weights_are_packed_in_their_own_storage_unless_someone_else_holds_them():
    model = make(tie=True, layers=1)
    reference = copy.deepcopy(model)
    ptrs = {n: m.weight.data_ptr() for n, m in model.named_modules() if n.endswith(PROJECTIONS)}
    ptrs["model.embed_tokens"] = model.model.embed_tokens.weight.data_ptr()
    held = model.model.layers[0].mlp.down_proj.weight  # a reference someone kept: it must stay intact
    install_kernel_policy(model, DROP)
    modules = dict(model.named_modules())
    for name, ptr in ptrs.items():
        same = modules[name]._buffers[PACKED_BUFFER].data_ptr() == ptr
        assert same == (name != "model.layers.0.mlp.down_proj"), name
    assert torch.equal(held, reference.model.layers[0].mlp.down_proj.weight)
    assert "weight" not in modules["model.layers.0.mlp.down_proj"]._parameters
    ids = torch.arange(3)
    install_kernel_policy(reference, KEEP)
    with torch.no_grad():
        assert torch.equal(model(ids), reference(ids))


_MEMORY_GUEST = r"""
import json, sys, torch
from rvascend.testing.rss import current_rss_mib, peak_rss_mib, reset_peak_rss
from rvascend.runtime import allocator
from rvascend.models import gguf_checkpoint
from rvascend.models.loader import load_model
from rvascend.policy import KernelPolicyConfig, install_kernel_policy
allocator.pin_mmap_threshold()  # as the server does
path, mode = sys.argv[1], sys.argv[2]
base = current_rss_mib()
reset_peak_rss()
model = load_model(path, torch.bfloat16, keep_quantized=True)
dense = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
loaded, loaded_peak = current_rss_mib(), peak_rss_mib()
report = install_kernel_policy(model, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed",
                                                   drop_unpacked=mode == "drop"))
print(json.dumps({"base": base, "loaded": loaded, "loaded_peak": loaded_peak, "after": current_rss_mib(), "peak": peak_rss_mib(),
                  "dense": dense, "packed": report.packed_bytes / 2**20}))
"""


def test_a_served_gguf_holds_each_weight_once_with_drop_unpacked(tmp_path):
    """RSS of a BF16 GGUF file loaded and packed as the server does: Qwen3-0.6B's shapes, two
    layers (its tied 151936 x 1024 embedding, 297 MiB, is most of it). Kept both ways, the
    packed copies come on top of the model; dropped, RSS stays the model's: every weight,
    the embedding included, is packed over its own storage. The load's peak is the model
    plus 16 MiB (it was the model plus the embedding twice, file pages and copy)."""
    from rvascend.testing.rss import fresh_process_json
    from rvascend.models import random_checkpoint
    from rvascend.models import gguf_export

    hf = random_checkpoint.write("qwen3-0.6b", str(tmp_path / "hf"), layers=2)
    path = str(tmp_path / "model.gguf")
    gguf_export.export(hf, path)
    runs = {mode: fresh_process_json(_MEMORY_GUEST, path, mode) for mode in ("drop", "keep")}
    drop, keep = runs["drop"], runs["keep"]
    print({m: {k: round(v) for k, v in r.items()} for m, r in runs.items()})
    assert drop["packed"] >= 0.95 * keep["dense"]  # every matrix packed, the embedding too
    # Dropped: the packed weights are the model; 32 MiB for the allocator and bookkeeping.
    assert drop["after"] - drop["base"] <= drop["dense"] + drop["packed"] + 32
    # Packing adds nothing to the peak, and the loader adds a slab of rows in flight: it copies
    # each tensor from the file's map 16 MiB at a time, releasing the pages it copied.
    assert drop["peak"] <= drop["loaded_peak"] + 8
    assert drop["loaded_peak"] <= drop["loaded"] + 32
    # Kept: both copies (the check that the bounds above could fail).
    assert keep["after"] - keep["base"] >= keep["dense"] + 0.9 * keep["packed"]
    assert keep["peak"] >= keep["loaded"] + 0.9 * keep["packed"]
