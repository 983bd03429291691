"""The fused decode step against the op-by-op path it replaces: bit-identical logits and
K/V, the same route counts, and every reason to run op by op instead."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import transformers

from rvascend.models.decoder import KVPool
from rvascend.models.loader import load_model
from rvascend.models.testing import decode_batch, decode_logits, random_pool, step_batch
from rvascend.ops import attention_kernel_has_block_form
from rvascend.policy import KernelPolicyConfig, get_policy, install_kernel_policy, repack
from rvascend.dispatch import fused_decoder, kernel_routes
from rvascend.dispatch import weights_generation
from rvascend.dispatch.fused_decoder import FUSED_ATTR

COMMON = dict(hidden_size=1024, intermediate_size=2048, num_hidden_layers=2, num_attention_heads=8,
              num_key_value_heads=4, vocab_size=2048, max_position_embeddings=256, initializer_range=0.05)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=128, tie_word_embeddings=True),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON, tie_word_embeddings=False),
}


_MODELS: dict = {}


def _model(family: str, tmp_path_factory):
    if family not in _MODELS:
        torch.manual_seed(0)
        path = str(tmp_path_factory.mktemp(family))
        transformers.AutoModelForCausalLM.from_config(FAMILIES[family]()).save_pretrained(path)
        m = load_model(path, torch.bfloat16)
        # The seed's gate packs these 1024-wide projections at every row count, so the op-by-op
        # path routes each call packed on any host (a host's timed gate may prefer F.linear for a
        # lone row, where the fused step, one call for all layers, still wins).
        install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed"))
        _MODELS[family] = m
    return family, _MODELS[family]


@pytest.fixture(params=sorted(FAMILIES))
def model(request, tmp_path_factory):
    return _model(request.param, tmp_path_factory)


@pytest.fixture(params=["llama", "qwen3"])
def fusing_model(request, tmp_path_factory):
    """The families whose layers fuse (qwen2's q/k/v bias keeps qkv_proj unpacked)."""
    return _model(request.param, tmp_path_factory)


def _clone(pool: KVPool) -> KVPool:
    copy = KVPool.__new__(KVPool)
    copy.k, copy.v, copy.num_slots = [k.clone() for k in pool.k], [v.clone() for v in pool.v], pool.num_slots
    return copy


# (cached, new) tokens per sequence: decode rows, a prompt, and a step mixing a prompt, the
# chunk of a longer one and a decode row.
STEPS = {"decode": [(39, 1)], "decode x3": [(8, 1), (56, 1), (22, 1)], "prefill": [(0, 40)],
         "chunked prefill": [(0, 12), (30, 5), (19, 1)]}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_fused_step_is_bit_identical_to_the_op_by_op_step(model, step):
    family, m = model
    policy = get_policy(m)
    batch = step_batch(STEPS[step])
    pool = random_pool(m)
    ops_pool, fused_pool = _clone(pool), _clone(pool)
    policy.counters.reset()
    policy.kernels.counters.reset()
    want = decode_logits(m, batch, ops_pool, fused=False)
    op_counts = (policy.counters.snapshot(), policy.kernels.counters.snapshot())
    policy.counters.reset()
    policy.kernels.counters.reset()
    got = decode_logits(m, batch, fused_pool, fused=True)
    kernels = policy.kernels.counters
    if family == "qwen2":  # q/k/v bias: qkv_proj is not packed, so the layers run op by op
        assert kernels.calls("decoder_layers", "fallback", "not_packable") == 1
        assert torch.equal(got, want)
        return
    assert kernels.calls("decoder_layers", "kernel") == 1
    assert torch.equal(got, want), (got.float() - want.float()).abs().max()
    for a, b in zip(ops_pool.k + ops_pool.v, fused_pool.k + fused_pool.v):
        assert torch.equal(a, b)  # the new tokens' K/V, written to the same slots
    fused_counts = [c for c in policy.kernels.counters.snapshot() if c["projection"] != "decoder_layers"]
    assert (policy.counters.snapshot(), fused_counts) == op_counts
    assert policy.counters.rows_seen("qkv_proj", "packed") == {len(batch.input_ids): m.config.num_hidden_layers}


def test_a_stale_packed_weight_is_never_used(fusing_model):
    family, m = fusing_model
    policy = get_policy(m)
    batch = decode_batch([30])
    pool = random_pool(m)
    # One pool throughout: the step's plan is kept between calls and must see the write.
    fresh = decode_logits(m, decode_batch([30]), pool, fused=True)
    assert torch.equal(decode_logits(m, decode_batch([30]), pool, fused=True), fresh)
    down = m.model.layers[1].mlp.down_proj
    before = down.weight.detach().clone()
    policy.kernels.counters.reset()
    policy.counters.reset()
    try:
        down.weight.data.mul_(-1)  # a weight loader's write: bypasses the version counter
        got = decode_logits(m, batch, pool, fused=True)
    finally:
        with torch.no_grad():
            down.weight.copy_(before)
    assert policy.kernels.counters.calls("decoder_layers", "fallback", "weight_content_changed") == 1
    # Op by op, down_proj ran F.linear on the new weight; the rest stayed packed.
    assert policy.counters.calls("down_proj", "fallback", "weight_content_changed") == 1
    assert policy.counters.calls("gate_up_proj", "packed") == m.config.num_hidden_layers
    assert not torch.equal(got, fresh)
    # The weight restored bit for bit (a new version, content as packed): fused again.
    repack(m)
    again = decode_logits(m, decode_batch([30]), pool, fused=True)
    assert policy.kernels.counters.calls("decoder_layers", "kernel") == 1
    assert torch.equal(again, fresh)
    # A write through the version counter is caught as well.
    with torch.no_grad():
        down.weight.mul_(1)
    decode_logits(m, decode_batch([30]), pool, fused=True)
    assert policy.kernels.counters.calls("decoder_layers", "fallback", "weight_mutated_in_place") == 1
    repack(m)


def _down(m):
    return m.model.layers[1].mlp.down_proj


def _norm(m):
    return m.model.layers[0].post_attention_layernorm


@pytest.mark.parametrize("what", ["projection", "norm", "final_norm", "head"])
@pytest.mark.parametrize("how", ["parameter_replaced", "storage_swapped"])
def test_the_kept_plan_sees_a_replaced_weight(fusing_model, what, how):
    """The step's plan is kept between calls and points at the weights it was built from (and
    keeps them alive): a new parameter object, or new storage under the same one (`.data =`),
    must reach the next step."""
    family, m = fusing_model
    module = {"projection": _down, "norm": _norm, "final_norm": lambda m: m.model.norm,
              "head": lambda m: m.lm_head}[what](m)
    pool = random_pool(m)
    fresh = decode_logits(m, decode_batch([30]), pool, fused=True)
    original = module.weight
    try:
        new = original.detach() * -2
        if how == "parameter_replaced":
            module.weight = torch.nn.Parameter(new, requires_grad=False)
        else:
            original.data = new
        generation = weights_generation.current(m)
        got = decode_logits(m, decode_batch([30]), pool, fused=True)
        # Undeclared, yet K/V computed from the old weights are retired all the same.
        changed = weights_generation.current(m) > generation
        want = decode_logits(m, decode_batch([30]), _clone(pool), fused=False)
    finally:
        if how == "parameter_replaced":
            module.weight = original
        else:
            original.data = new.div_(-2)
        repack(m)
    assert not torch.equal(got, fresh)
    assert torch.equal(got, want)
    assert changed
    assert torch.equal(decode_logits(m, decode_batch([30]), pool, fused=True), fresh)


def test_a_final_norm_unlike_the_layers_runs_op_by_op(fusing_model):
    """The fused call runs the model's last norm with the layers' eps: a model whose last
    norm has another eps takes the op-by-op path, which honours it."""
    family, m = fusing_model
    policy = get_policy(m)
    eps, kept = m.model.norm.eps, m.__dict__[FUSED_ATTR]
    pool = random_pool(m)
    try:
        m.model.norm.eps = eps * 1000
        fused_decoder.attach(m, policy)
        policy.kernels.counters.reset()
        got = decode_logits(m, decode_batch([30]), _clone(pool), fused=True)
        want = decode_logits(m, decode_batch([30]), _clone(pool), fused=False)
    finally:
        m.model.norm.eps = eps
        m.__dict__[FUSED_ATTR] = kept
    assert policy.kernels.counters.calls("decoder_layers", "fallback", "final_norm") == 1
    assert torch.equal(got, want)


def test_the_logits_come_out_of_the_fused_call(fusing_model, monkeypatch):
    """The output projection runs in the fused call over the rows the step samples (no
    packed Linear call from Python), bit-identical to op by op; where op by op's gate sends
    it elsewhere, the call returns the normed rows and the model projects them as op by op."""
    from rvascend import ops
    from rvascend.dispatch import shape_gate

    family, m = fusing_model
    policy = get_policy(m)
    kernels = policy.kernels.counters
    linear_calls = []
    packed_linear = ops.packed_bf16_linear
    monkeypatch.setattr(ops, "packed_bf16_linear", lambda *a: linear_calls.append(a[2]) or packed_linear(*a))
    batch, pool = step_batch(STEPS["chunked prefill"]), random_pool(m)
    want = decode_logits(m, batch, _clone(pool), fused=False)
    assert linear_calls[-1] == m.config.vocab_size  # op by op: the head (N = vocab), last
    linear_calls.clear()
    kernels.reset()
    policy.counters.reset()
    got = decode_logits(m, batch, _clone(pool), fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 1 and linear_calls == []
    assert policy.counters.rows_seen("lm_head", "packed") == {3: 1}  # each sequence's last row
    assert got.shape == (3, m.config.vocab_size) and torch.equal(got, want)
    rows_gate = shape_gate.rows_gate
    monkeypatch.setattr(shape_gate, "rows_gate", lambda projection, *a: "measured_slower"
                        if projection == "lm_head" else rows_gate(projection, *a))
    want = decode_logits(m, batch, _clone(pool), fused=False)
    policy.counters.reset()
    got = decode_logits(m, batch, _clone(pool), fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 2
    assert policy.counters.calls("lm_head", "fallback", "measured_slower") == 1
    assert torch.equal(got, want)


def test_what_op_by_op_would_route_elsewhere_runs_op_by_op(fusing_model, monkeypatch):
    family, m = fusing_model
    policy = get_policy(m)
    kernels = policy.kernels.counters
    kernels.reset()
    # More prompt rows than a fused step keeps scratch for.
    monkeypatch.setattr(fused_decoder, "FUSED_PREFILL_ROWS", 11)
    decode_logits(m, step_batch([(0, 12)]), random_pool(m), fused=True)
    assert kernels.calls("decoder_layers", "fallback", "prefill_rows_out_of_range") == 1
    monkeypatch.undo()
    # Rows the seed's gate leaves to F.linear (2-15 without small batches).
    fused = fused_decoder.fused_decoder_of(m)
    monkeypatch.setattr(fused, "context", dataclasses.replace(fused.context, small_batch=False))
    decode_logits(m, step_batch([(0, 12)]), random_pool(m), fused=True)
    assert kernels.calls("decoder_layers", "fallback", "qkv_proj_small_batch_off") == 1
    monkeypatch.undo()
    # Keys the attention kernel leaves to SDPA (x86's row kernels, past their limit).
    monkeypatch.setattr(kernel_routes, "ROW_KERNEL_PREFILL_KEYS", 11)
    decode_logits(m, step_batch([(0, 12)]), random_pool(m), fused=True)
    long = "long_prefill_without_block_kernel"
    assert kernels.calls("decoder_layers", "fallback", long) == (0 if attention_kernel_has_block_form() else 1)
    monkeypatch.undo()
    assert kernels.calls("decoder_layers", "kernel") == (1 if attention_kernel_has_block_form() else 0)
    policy.kernels.enabled = False
    try:
        decode_logits(m, decode_batch([20]), random_pool(m), fused=True)
        assert kernels.calls("decoder_layers", "fallback", "kernels_off") == 1
    finally:
        policy.kernels.enabled = True


def test_a_bad_slot_is_an_error_before_anything_is_written(fusing_model):
    family, m = fusing_model
    batch = decode_batch([20])
    batch.kv_slots[0][3] = 10_000
    pool = random_pool(m)
    before = _clone(pool)
    with pytest.raises(ValueError, match="outside the KV pool"):
        decode_logits(m, batch, pool, fused=True)
    for a, b in zip(pool.k + pool.v, before.k + before.v):
        assert torch.equal(a, b)



def _desc_with(desc, layer0=None, **fields):
    """A copy of a DecoderModelDesc with `fields` replaced, and layer 0's fields `layer0`."""
    from rvascend.ops.packed_linear import _native

    copy = _native.DecoderModelDesc(desc)
    for name, value in fields.items():
        setattr(copy, name, value)
    layers = [_native.LayerDesc(layer) for layer in desc.layers]
    for name, value in (layer0 or {}).items():
        setattr(layers[0], name, value)
    copy.layers = layers
    return copy


def test_the_native_model_checks_every_buffer_by_its_field_name(fusing_model):
    """The model's description is checked once, when the native model is built: every
    buffer against the shape, named by its field; a tensor's dtype and contiguity too."""
    from rvascend.ops.packed_linear import _native

    _, m = fusing_model
    batch, pool = decode_batch([5, 9]), random_pool(m)
    decode_logits(m, batch, pool, fused=True)
    desc = m.__dict__[FUSED_ATTR]._plan.desc
    c = m.config
    _native.DecoderModel(_desc_with(desc))
    k_pool = desc.layers[0].k_pool
    packed = desc.layers[0].gate_up.packed
    shape = _native.DecoderShape(desc.shape)
    shape.intermediate += 32
    for layer0, fields, message in (
            (dict(k_pool=(k_pool[0], k_pool[1] - 1)), {}, "layer 0 k_pool has"),
            (dict(k_pool=pool.k[0].float()), {}, "layer 0 k_pool has elements of 4 bytes"),
            (dict(v_pool=pool.v[0].transpose(-1, -2)), {}, "layer 0 v_pool is not contiguous"),
            (dict(gate_up=_native.ProjectionDesc(packed=(packed[0], packed[1] - 1))), {}, "layer 0 gate_up has"),
            ({}, dict(shape=shape), "layer 0 gate_up has"),
            (dict(input_norm=None), {}, "layer 0 input_norm has 0 elements"),
            (dict(q_norm=None), {}, "layer 0 q_norm and k_norm: give both or neither")
            if desc.layers[0].q_norm[0] else
            (dict(q_norm=m.model.norm.weight), {}, "layer 0 q_norm and k_norm: give both or neither"),
            (dict(qkv=_native.ProjectionDesc(parts=[_native.QuantPartDesc(format="Q5_9", rows=1, data=None)])), {},
             "layer 0 qkv part 0: .*Q5_9"),
            ({}, dict(final_norm=m.model.norm.weight[:-1]), "final_norm has"),
            ({}, dict(head=_native.ProjectionDesc(packed=(desc.head.packed[0], desc.head.packed[1] - 1))),
             "head has"),
            ({}, dict(vocab=0), "head: vocab is 0"),
            ({}, dict(block_n=0), "layer 0 qkv: a BF16 projection needs the model's block_n"),
            # A buffer the layer's kind does not carry is refused, not ignored.
            (dict(conv_state=pool.k[0]), {}, "layer 0 conv_state: a layer of kind attention has none"),
            (dict(kind=_native.LayerKind(7)), {}, "layer 0 kind: unknown layer kind 7")):
        with pytest.raises(ValueError, match=message):
            _native.DecoderModel(_desc_with(desc, layer0, **fields))
    assert c.num_hidden_layers == _native.DecoderModel(_desc_with(desc)).num_layers


def test_a_step_checks_its_buffers_and_the_kernel_sets_layout(fusing_model):
    """Each step's buffers are checked before anything is written, and a named kernel set
    must read the block_n the weights were packed with (else a layout-2 weight would be
    read as layout 1, wrong at every step without an error)."""
    from rvascend import ops
    from rvascend.ops.packed_linear import _native

    _, m = fusing_model
    batch, pool = decode_batch([5, 9]), random_pool(m)
    decode_logits(m, batch, pool, fused=True)
    plan = m.__dict__[FUSED_ATTR]._plan
    c = m.config
    h = torch.randn(2, c.hidden_size).bfloat16()
    cos, sin = m.rotary(batch.positions, h.dtype)
    cos, sin = cos.contiguous(), sin.contiguous()
    kv_slots, kv_starts, q_starts = batch.flat_index()
    out, res = torch.empty_like(h), torch.empty_like(h)
    logits, bad_rows = torch.empty(2, c.vocab_size, dtype=torch.bfloat16), torch.tensor([0, 2])
    assert plan.head is not None and plan.head.packed[0] != 0  # the tied embedding's packed copy
    args = dict(tokens=2, batch=2, rotary_dim=cos.shape[-1], q_starts=q_starts, kv_starts=kv_starts,
                kv_slots=kv_slots, write_slots=batch.write_slots, cos=cos, sin=sin, h=h, h_out=out,
                residual_out=res, num_threads=1)
    plan.model.run(_native.DecoderStepArgs(**args))
    head = dict(project_head=True, logits=logits)
    for change, message in (
            (dict(h=h[:1]), "h has"),
            (dict(h=h.float()), "h has elements of 4 bytes"),
            (dict(write_slots=batch.write_slots[:1]), "write_slots has"),
            (dict(write_slots=batch.write_slots.int()), "write_slots has elements of 4 bytes"),
            (dict(q_starts=q_starts[:2]), "q_starts has"),
            (dict(cos=cos[:1]), "cos has"),
            (dict(rotary_dim=3), "rotary_dim 3 is not an even number"),
            (dict(head, logits=logits[:1]), "logits has"),
            (dict(head, head_rows=bad_rows), "head row 1 is 2, outside"),
            (dict(kernel_set="no_such_set"), "kernel set 'no_such_set' is not available"),
            *((dict(kernel_set=name), "reads block_n .* packed with block_n")
              for name in ops.available_kernel_sets() if _native.kernel_set_block_n(name) != plan.block_n)):
        before = [k.clone() for k in pool.k]
        with pytest.raises(ValueError, match=message):
            plan.model.run(_native.DecoderStepArgs(**{**args, **change}))
        assert all(torch.equal(a, b) for a, b in zip(before, pool.k)), change  # nothing written
    with pytest.raises(TypeError):
        _native.DecoderStepArgs(**{**args, "h": "not a buffer"})


def test_smollm2_shaped_fused_step_under_the_measured_gate(tmp_path, monkeypatch):
    """Width 576 (SmolLM2-135M: 9 heads and 3 KV heads of 64, intermediate 1536, tied):
    the seed's gate packs none of it; under the measured gate every projection is packed,
    the decode step runs in one native call, bit-identical to module by module."""
    from rvascend.dispatch import shape_gate

    monkeypatch.setattr(shape_gate, "measured_packed_wins", lambda m, n, k: True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                                      num_attention_heads=9, num_key_value_heads=3, vocab_size=2048,
                                      max_position_embeddings=256, tie_word_embeddings=True, initializer_range=0.05)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(tmp_path))
    seed = load_model(str(tmp_path), torch.bfloat16)
    assert not install_kernel_policy(seed, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed")).packed
    m = load_model(str(tmp_path), torch.bfloat16)
    report = install_kernel_policy(m, KernelPolicyConfig(compile_mode="eager", shape_gate="measured"))
    assert len(report.packed) == 4 * 2 + 1 and report.shape_gate == "measured"
    batch, pool = decode_batch([17, 40]), random_pool(m)
    ops_pool, fused_pool = _clone(pool), _clone(pool)
    want = decode_logits(m, batch, ops_pool, fused=False)
    get_policy(m).kernels.counters.reset()
    got = decode_logits(m, batch, fused_pool, fused=True)
    assert get_policy(m).kernels.counters.calls("decoder_layers", "kernel") == 1
    assert torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(ops_pool.k + ops_pool.v, fused_pool.k + fused_pool.v))
    # A prompt where F.linear timed faster for every call of more than one row: op by op
    # takes it, the fused step (one call for all layers) still runs, within BF16 noise of it.
    monkeypatch.setattr(shape_gate, "measured_packed_wins", lambda m, n, k: m == 1)
    batch = step_batch([(0, 24), (10, 6)])
    want = decode_logits(m, batch, _clone(pool), fused=False)
    assert get_policy(m).counters.calls("gate_up_proj", "fallback", "measured_slower") == 2
    got = decode_logits(m, batch, _clone(pool), fused=True)
    assert get_policy(m).kernels.counters.calls("decoder_layers", "kernel") == 2
    assert (got.float() - want.float()).abs().max() <= 0.02 * want.float().abs().max()


def test_fused_step_with_the_packed_copy_as_the_weight(tmp_path):
    """--cpu-kernels-drop-unpacked: the fused step reads the packed weights of record, bit-identical
    to the mode that keeps both copies, and a reload reaches the next step."""
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**COMMON, tie_word_embeddings=False)).save_pretrained(tmp_path / "b")
    keep, drop = load_model(str(tmp_path / "b"), torch.bfloat16), load_model(str(tmp_path / "b"), torch.bfloat16)
    install_kernel_policy(keep, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed"))
    install_kernel_policy(drop, KernelPolicyConfig(compile_mode="eager", shape_gate="bucketed", drop_unpacked=True))
    assert "weight" not in drop.model.layers[0].mlp.down_proj._parameters
    pool = random_pool(keep)
    batch = decode_batch([9, 57, 23])
    kernels = get_policy(drop).kernels.counters
    got, want = decode_logits(drop, batch, _clone(pool), fused=True), decode_logits(keep, batch, _clone(pool), fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 1
    assert torch.equal(got, want)
    # The step's plan is kept between calls; a reload replaces the packed weights it points at.
    state = {k: (-v if k.endswith("down_proj.weight") else v) for k, v in keep.state_dict().items()}
    drop.load_state_dict(state)
    keep.load_state_dict(state)
    repack(keep)
    got, want = decode_logits(drop, batch, _clone(pool), fused=True), decode_logits(keep, batch, _clone(pool), fused=True)
    assert kernels.calls("decoder_layers", "kernel") == 2
    assert torch.equal(got, want)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
