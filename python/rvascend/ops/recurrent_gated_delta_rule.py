"""`torch.ops.rvascend.recurrent_gated_delta_rule`: Gated DeltaNet decode / MTP.

Per sequence b (tokens [seq0, seq0 + len), len <= 8) and value head h, in FP32:
the state S = state[read_slot, h] ([Dv, Dk]) is decayed by exp(g) and exp(gk),
updated by the delta rule with beta, read out with scale * query, and written
to state[ssm_state_indices[t], h] after every token t. The state pool is
updated in place; the op returns out [T, NV, Dv].

On the CPU it runs a native implementation; `run_on_twin` runs the AscendC
kernel source on the CPU twin instead (for proving the kernel). Every input is
validated before the state is touched.
"""

from __future__ import annotations

import importlib
from typing import Any, Optional

import torch

from rvascend.ops.native import load_extension
from rvascend.ops.packed_linear import register_fake

_native = load_extension("_recurrent_gated_delta_rule")

MAX_MTP: int = int(_native.MAX_MTP)
MAX_HEADS: int = int(_native.MAX_HEADS)
MAX_HEAD_DIM: int = int(_native.MAX_HEAD_DIM)
TwinError = _native.TwinError


def available_row_kernels(dtype: str = "bfloat16") -> list[str]:
    """The CPU op's row kernels on this CPU for `dtype` ("bfloat16", "float16", "float32"), best first."""
    return list(_native.available_row_kernels(dtype))


def available_deltanet_pieces(dtype: str = "bfloat16") -> list[str]:
    """A DeltaNet decode step's piece sets (conv + SiLU, L2 norm, gated norm) on this CPU for
    `dtype` ("bfloat16", "float32"), best first."""
    return list(_native.available_deltanet_pieces(dtype))
# SoC name -> (UB bytes per vector core, vector cores): op_host/recurrent_gated_delta_rule_platforms.h.
PLATFORMS = {name: (int(spec["ub_bytes"]), int(spec["vector_cores"])) for name, spec in _native.SOCS.items()}
DEFAULT_SOC = "Ascend910B3"

_ELEM = {torch.float16: "float16", torch.bfloat16: "bfloat16", torch.float32: "float32"}
_INT32_MAX = 2**31 - 1


def _shape_error(name: str, t: torch.Tensor, expected: str) -> ValueError:
    return ValueError(f"{name} has shape {tuple(t.shape)}, expected {expected}")


def validate(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor, beta: torch.Tensor,
             actual_seq_lengths: torch.Tensor, ssm_state_indices: torch.Tensor,
             num_accepted_tokens: Optional[torch.Tensor], g: Optional[torch.Tensor], gk: Optional[torch.Tensor],
             kernel_dtypes_only: bool = False, max_tokens: Optional[int] = MAX_MTP) -> dict[str, int]:
    """Checks every input against the op definition; returns T, B, NK, NV, Dk, Dv, S.
    max_tokens: the longest sequence allowed (None: any, for prompts on the CPU)."""
    if query.dtype not in _ELEM or (kernel_dtypes_only and query.dtype == torch.float32):
        raise TypeError(f"query must be float16 or bfloat16{'' if kernel_dtypes_only else ' (or float32 on the CPU)'}, "
                        f"got {query.dtype}")
    for name, t in (("key", key), ("value", value), ("beta", beta), ("state", state)):
        if t.dtype != query.dtype:
            raise TypeError(f"{name} is {t.dtype} but query is {query.dtype}: they must match")
    if query.dim() != 3:
        raise _shape_error("query", query, "[T, NK, Dk]")
    T, NK, Dk = query.shape
    if key.shape != query.shape:
        raise _shape_error("key", key, f"{tuple(query.shape)} like query")
    if value.dim() != 3 or value.shape[0] != T:
        raise _shape_error("value", value, f"[{T}, NV, Dv]")
    NV, Dv = value.shape[1], value.shape[2]
    if not (1 <= NK <= MAX_HEADS and 1 <= NV <= MAX_HEADS):
        raise ValueError(f"NK = {NK}, NV = {NV}: head counts must be in 1..{MAX_HEADS}")
    if NV % NK:
        raise ValueError(f"NV = {NV} is not a multiple of NK = {NK}")
    if not (1 <= Dk <= MAX_HEAD_DIM and 1 <= Dv <= MAX_HEAD_DIM):
        raise ValueError(f"Dk = {Dk}, Dv = {Dv}: head dims must be in 1..{MAX_HEAD_DIM}")
    if beta.shape != (T, NV):
        raise _shape_error("beta", beta, f"[{T}, {NV}]")
    if state.dim() != 4 or tuple(state.shape[1:]) != (NV, Dv, Dk):
        raise _shape_error("state", state, f"[S, {NV}, {Dv}, {Dk}] (Dk contiguous)")
    if not state.is_contiguous():
        raise ValueError("state must be contiguous: it is updated in place")
    S = state.shape[0]
    _check_gates(g, gk, T, NV, Dk)
    for name, t in (("actual_seq_lengths", actual_seq_lengths), ("ssm_state_indices", ssm_state_indices)):
        if t.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name} must be int32 or int64, got {t.dtype}")
        if t.dim() != 1:
            raise _shape_error(name, t, "1-D")
    B = actual_seq_lengths.shape[0]
    if ssm_state_indices.shape[0] != T:
        raise _shape_error("ssm_state_indices", ssm_state_indices, f"[{T}] (one slot per token)")
    if num_accepted_tokens is not None:
        if num_accepted_tokens.dtype != torch.int32:
            raise TypeError(f"num_accepted_tokens must be int32, got {num_accepted_tokens.dtype}")
        if num_accepted_tokens.shape != (B,):
            raise _shape_error("num_accepted_tokens", num_accepted_tokens, f"[{B}]")
    _check_sequences(actual_seq_lengths.tolist(), ssm_state_indices, T, S, max_tokens)
    return {"t": T, "b": B, "nk": NK, "nv": NV, "dk": Dk, "dv": Dv, "num_slots": S}


def _check_gates(g: Optional[torch.Tensor], gk: Optional[torch.Tensor], T: int, NV: int, Dk: int) -> None:
    """The decay gates: g per head, gk per head or per key channel, FP32."""
    if g is not None:
        if g.dtype != torch.float32:
            raise TypeError(f"g must be float32, got {g.dtype}")
        if g.shape != (T, NV):
            raise _shape_error("g", g, f"[{T}, {NV}]")
    if gk is not None:
        if gk.dtype != torch.float32:
            raise TypeError(f"gk must be float32, got {gk.dtype}")
        if gk.shape not in ((T, NV), (T, NV, Dk)):
            raise _shape_error("gk", gk, f"[{T}, {NV}] or [{T}, {NV}, {Dk}]")


def _check_sequences(lengths: list[int], indices: torch.Tensor, T: int, S: int, max_tokens: Optional[int]) -> None:
    """Each sequence's length within max_tokens, all of them T tokens, and every token's state
    slot in the pool and owned by its sequence alone."""
    for b, n in enumerate(lengths):
        if max_tokens is not None and n > max_tokens:
            raise ValueError(f"actual_seq_lengths[{b}] = {n} exceeds MAX_MTP = {max_tokens} tokens per sequence")
    total = sum(max(n, 0) for n in lengths)
    if total != T:
        raise ValueError(f"actual_seq_lengths add up to {total} tokens but query has T = {T}")
    if T:
        bad = torch.nonzero((indices < 0) | (indices >= S)).flatten()
        if bad.numel():
            i = int(bad[0])
            v = int(indices[i])
            if v > _INT32_MAX or v < -_INT32_MAX - 1:
                raise ValueError(f"ssm_state_indices[{i}] = {v} does not fit in int32")
            raise ValueError(f"ssm_state_indices[{i}] = {v} is outside the state pool of {S} slots")
        # A sequence reads and writes only its own slots; two sequences sharing
        # one would make the result depend on the order the cores run them.
        owner: dict[int, int] = {}
        slots = indices.tolist()
        seq0 = 0
        for b, n in enumerate(lengths):
            for slot in slots[seq0:seq0 + max(n, 0)]:
                if owner.setdefault(slot, b) != b:
                    raise ValueError(f"ssm_state_indices: slot {slot} belongs to sequence {owner[slot]} and to "
                                     f"sequence {b}; sequences of one call must use distinct state slots")
            seq0 += max(n, 0)


def _spec(shapes: dict[str, int], query, key, value, state, beta, scale, lengths, indices, accepted, g, gk,
          out) -> tuple[dict[str, Any], list[torch.Tensor]]:
    keep = [query.contiguous(), key.contiguous(), value.contiguous(), beta.contiguous(), lengths.contiguous(),
            indices.contiguous()]
    q, k, v, b, lens, idx = keep
    spec: dict[str, Any] = dict(shapes, elem=_ELEM[query.dtype], query=q.data_ptr(), key=k.data_ptr(),
                                value=v.data_ptr(), beta=b.data_ptr(), state=state.data_ptr(),
                                seq_lens=lens.data_ptr(), seq_lens_int64=lens.dtype == torch.int64,
                                indices=idx.data_ptr(), indices_int64=idx.dtype == torch.int64, out=out.data_ptr(),
                                scale=float(scale), gk_per_dim=gk is not None and gk.dim() == 3, g=0, gk=0, accepted=0)
    for name, t in (("g", g), ("gk", gk), ("accepted", accepted)):
        if t is not None:
            t = t.contiguous()
            keep.append(t)
            spec[name] = t.data_ptr()
    return spec, keep


torch.library.define(
    "rvascend::recurrent_gated_delta_rule",
    "(Tensor query, Tensor key, Tensor value, Tensor(a!) state, Tensor beta, float scale, "
    "Tensor actual_seq_lengths, Tensor ssm_state_indices, Tensor? num_accepted_tokens=None, "
    "Tensor? g=None, Tensor? gk=None) -> Tensor")


@torch.library.impl("rvascend::recurrent_gated_delta_rule", "CPU")
def _rgdr_cpu(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
              num_accepted_tokens=None, g=None, gk=None):
    shapes = validate(query, key, value, state, beta, actual_seq_lengths, ssm_state_indices, num_accepted_tokens,
                      g, gk)
    out = torch.empty((shapes["t"], shapes["nv"], shapes["dv"]), dtype=query.dtype)
    if shapes["t"]:
        spec, _keep = _spec(shapes, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                            num_accepted_tokens, g, gk, out)
        _native.run_cpu(spec, torch.get_num_threads())
    return out


@register_fake("rvascend::recurrent_gated_delta_rule")
def _rgdr_fake(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
               num_accepted_tokens=None, g=None, gk=None):
    return query.new_empty((query.shape[0], value.shape[1], value.shape[2]))


def _npu_module():
    try:
        return importlib.import_module("rvascend_npu")
    except ImportError:
        return None


@torch.library.impl("rvascend::recurrent_gated_delta_rule", "PrivateUse1")
def _rgdr_npu(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
              num_accepted_tokens=None, g=None, gk=None):
    validate(query.cpu(), key.cpu(), value.cpu(), state, beta.cpu(), actual_seq_lengths.cpu(),
             ssm_state_indices.cpu(), None if num_accepted_tokens is None else num_accepted_tokens.cpu(),
             None if g is None else g.cpu(), None if gk is None else gk.cpu(), kernel_dtypes_only=True)
    npu = _npu_module()
    if npu is None:
        raise NotImplementedError(
            "recurrent_gated_delta_rule on the NPU needs the CANN build of this op (module rvascend_npu): "
            "see ascend_kernels/recurrent_gated_delta_rule/README.md")
    return npu.recurrent_gated_delta_rule(query, key, value, state, beta, scale, actual_seq_lengths,
                                          ssm_state_indices, num_accepted_tokens, g, gk)


def recurrent_gated_delta_rule(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor,
                               beta: torch.Tensor, scale: float, actual_seq_lengths: torch.Tensor,
                               ssm_state_indices: torch.Tensor, num_accepted_tokens: Optional[torch.Tensor] = None,
                               g: Optional[torch.Tensor] = None, gk: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Runs the op (state updated in place); returns out [T, NV, Dv]."""
    return torch.ops.rvascend.recurrent_gated_delta_rule(query, key, value, state, beta, scale, actual_seq_lengths,
                                                         ssm_state_indices, num_accepted_tokens, g, gk)


def gated_delta_rule_prompts(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor,
                             beta: torch.Tensor, g: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor,
                             scale: float = 1.0) -> torch.Tensor:
    """Prompts (or prompt chunks) through the recurrence, on the CPU op's row kernels: sequence b's
    lengths[b] tokens start from state[slots[b]], and its state after its last token is written back
    there (state updated in place; nothing stored for the tokens before). Any length. Inputs as for
    recurrent_gated_delta_rule, T = sum(lengths); returns out [T, NV, Dv].

    Per token this is the decode step's rank-one update, O(Dk Dv) per head: where ATen has no
    vector GEMMs (riscv64) it costs far less than the chunked form's matrix products."""
    if lengths.dtype != torch.int64 or slots.dtype != torch.int64 or lengths.shape != slots.shape:
        raise ValueError(f"lengths and slots must be int64 of one shape [B], got {lengths.dtype} "
                         f"{tuple(lengths.shape)} and {slots.dtype} {tuple(slots.shape)}")
    if (lengths < 0).any():
        raise ValueError(f"lengths must not be negative, got {lengths.tolist()}")
    indices = torch.repeat_interleave(slots, lengths)  # one slot per token: the sequence's
    shapes = validate(query, key, value, state, beta, lengths, indices, None, g, None, max_tokens=None)
    out = torch.empty((shapes["t"], shapes["nv"], shapes["dv"]), dtype=query.dtype)
    if shapes["t"]:
        spec, _keep = _spec(shapes, query, key, value, state, beta, scale, lengths, indices, None, g, None, out)
        spec["last_state_only"] = True
        _native.run_cpu(spec, torch.get_num_threads())
    return out


def deltanet_decode(mixed: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                    conv_state: torch.Tensor, conv_weight: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor,
                    norm_weight: torch.Tensor, norm_eps: float, ssm_state: torch.Tensor, slots: torch.Tensor,
                    num_key_heads: int, lengths: Optional[torch.Tensor] = None,
                    read_slots: Optional[torch.Tensor] = None,
                    token_slots: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A Gated DeltaNet layer's step from its in_proj output to its out_proj input in one native
    call (the conv, SiLU, q/k L2 norms, beta and decay, the delta rule, the gated RMSNorm;
    cpu/deltanet_decode.h): one token per sequence (decode), or with `lengths` (int64 [B])
    sequences of any length, tokens in order (prompts and their chunks through the recurrence).

    mixed [T, C] (C = 2 NK Dk + NV Dv), z [T, NV Dv], b and a [T, NV]: parts of the in_proj output,
    columns contiguous. conv_state [S, C, K - 1] and ssm_state [S, NV, Dv, Dk] (FP32) are updated in
    place at `slots` (int64, one per sequence), or with `read_slots` (int64 [B]) read from those and
    written to `slots`, the read slots left as they were (double-buffered states: a failed step is
    dropped without an undo copy). With `token_slots` (int64 [T]: -1, or a slot per token; -1 for
    each sequence's last token) a token's states after it are also left in its token slot: a
    speculative verify step keeps every drafted position's states so that the next step reads the
    last accepted one's. Returns [T, NV Dv] in mixed's dtype."""
    dtype = mixed.dtype
    if dtype not in _ELEM:
        raise TypeError(f"mixed must be bfloat16, float16 or float32, got {dtype}")
    for name, t in (("z", z), ("b", b), ("a", a), ("conv_state", conv_state), ("conv_weight", conv_weight),
                    ("a_log", a_log), ("dt_bias", dt_bias), ("norm_weight", norm_weight)):
        if t.dtype != dtype:
            raise TypeError(f"{name} is {t.dtype} but mixed is {dtype}: they must match")
    if ssm_state.dtype != torch.float32 or ssm_state.dim() != 4 or not ssm_state.is_contiguous():
        raise _shape_error("ssm_state", ssm_state, "contiguous float32 [S, NV, Dv, Dk]")
    S, NV, Dv, Dk = ssm_state.shape
    if num_key_heads < 1 or NV % num_key_heads:
        raise ValueError(f"NV = {NV} is not a multiple of NK = {num_key_heads}")
    if mixed.dim() != 2 or mixed.stride(1) != 1:
        raise _shape_error("mixed", mixed, "[T, C] with contiguous columns")
    T, C = mixed.shape
    if C != 2 * num_key_heads * Dk + NV * Dv:
        raise _shape_error("mixed", mixed, f"[T, {2 * num_key_heads * Dk + NV * Dv}] (q, k, v)")
    if z.shape != (T, NV * Dv) or z.stride(1) != 1:
        raise _shape_error("z", z, f"[{T}, {NV * Dv}] with contiguous columns")
    if norm_weight.shape != (Dv,) or not norm_weight.is_contiguous():
        raise _shape_error("norm_weight", norm_weight, f"contiguous [{Dv}]")
    if b.shape != (T, NV) or a.shape != (T, NV) or b.stride(1) != 1 or a.stride() != b.stride():
        raise _shape_error("b and a", b, f"[{T}, {NV}] with contiguous columns and one row stride")
    if conv_state.dim() != 3 or conv_state.shape[:2] != (S, C) or not conv_state.is_contiguous():
        raise _shape_error("conv_state", conv_state, f"contiguous [{S}, {C}, K - 1]")
    K = conv_state.shape[2] + 1
    if conv_weight.shape != (C, K) or not conv_weight.is_contiguous():
        raise _shape_error("conv_weight", conv_weight, f"contiguous [{C}, {K}]")
    for name, t in (("a_log", a_log), ("dt_bias", dt_bias)):
        if t.shape != (NV,) or not t.is_contiguous():
            raise _shape_error(name, t, f"contiguous [{NV}]")
    B = T if lengths is None else lengths.shape[0]
    if lengths is not None and (lengths.dtype != torch.int64 or lengths.dim() != 1 or not lengths.is_contiguous()):
        raise _shape_error("lengths", lengths, "contiguous int64 [B]")
    if slots.dtype != torch.int64 or slots.shape != (B,) or not slots.is_contiguous():
        raise _shape_error("slots", slots, f"contiguous int64 [{B}] (one per sequence)")
    if read_slots is not None and (read_slots.dtype != torch.int64 or read_slots.shape != (B,)
                                   or not read_slots.is_contiguous()):
        raise _shape_error("read_slots", read_slots, f"contiguous int64 [{B}] (one per sequence)")
    if token_slots is not None and (token_slots.dtype != torch.int64 or token_slots.shape != (T,)
                                    or not token_slots.is_contiguous()):
        raise _shape_error("token_slots", token_slots, f"contiguous int64 [{T}] (one per token, -1 for none)")
    out = torch.empty((T, NV * Dv), dtype=dtype)
    if T:
        _native.deltanet_decode({
            "elem": _ELEM[dtype], "t": T, "sequences": B, "lens": lengths.data_ptr() if lengths is not None else 0,
            "nk": num_key_heads, "nv": NV, "dk": Dk, "dv": Dv, "kernel": K,
            "num_slots": S, "mixed": mixed.data_ptr(), "mixed_stride": mixed.stride(0) if T > 1 else C,
            "b": b.data_ptr(), "a": a.data_ptr(), "gate_stride": b.stride(0) if T > 1 else NV,
            "z": z.data_ptr(), "z_stride": z.stride(0) if T > 1 else NV * Dv, "norm_weight": norm_weight.data_ptr(),
            "norm_eps": float(norm_eps),
            "conv_state": conv_state.data_ptr(), "conv_weight": conv_weight.data_ptr(),
            "a_log": a_log.data_ptr(), "dt_bias": dt_bias.data_ptr(), "ssm_state": ssm_state.data_ptr(),
            "slots": slots.data_ptr(), "read_slots": read_slots.data_ptr() if read_slots is not None else 0,
            "token_slots": token_slots.data_ptr() if token_slots is not None else 0,
            "out": out.data_ptr()}, torch.get_num_threads())
    return out


def tiling(query: torch.Tensor, value: torch.Tensor, state: torch.Tensor, batches: int, *, has_g: bool,
           gk: Optional[torch.Tensor], has_accepted: bool, seq_lens_int64: bool, indices_int64: bool, scale: float,
           platform: str = DEFAULT_SOC) -> dict[str, Any]:
    """The host tiling the NPU launch would use (UB plan, vStep, blockDim) on SoC `platform`."""
    if platform not in PLATFORMS:
        raise ValueError(f"unknown SoC {platform!r}; known: {sorted(PLATFORMS)}")
    ub, cores = PLATFORMS[platform]
    spec = {"elem": _ELEM[query.dtype], "t": query.shape[0], "b": batches, "nk": query.shape[1],
            "nv": value.shape[1], "dk": query.shape[2], "dv": value.shape[2], "num_slots": state.shape[0],
            "has_g": has_g, "has_gk": gk is not None, "gk_per_dim": gk is not None and gk.dim() == 3,
            "has_accepted": has_accepted, "seq_lens_int64": seq_lens_int64, "indices_int64": indices_int64,
            "scale": float(scale)}
    return _native.compute_tiling(spec, ub, cores)


def run_on_twin(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, state: torch.Tensor, beta: torch.Tensor,
                scale: float, actual_seq_lengths: torch.Tensor, ssm_state_indices: torch.Tensor,
                num_accepted_tokens: Optional[torch.Tensor] = None, g: Optional[torch.Tensor] = None,
                gk: Optional[torch.Tensor] = None, platform: str = DEFAULT_SOC,
                tiling_override: Optional[dict[str, Any]] = None) -> tuple[torch.Tensor, dict[str, Any], dict[str, Any]]:
    """Runs the AscendC kernel source on the CPU twin of SoC `platform`: (out, counters, tiling).

    The twin's UB and queue limits are the SoC's, whatever the tiling assumed."""
    shapes = validate(query, key, value, state, beta, actual_seq_lengths, ssm_state_indices, num_accepted_tokens,
                      g, gk, kernel_dtypes_only=True)
    plan = tiling_override or tiling(query, value, state, shapes["b"], has_g=g is not None, gk=gk,
                                     has_accepted=num_accepted_tokens is not None,
                                     seq_lens_int64=actual_seq_lengths.dtype == torch.int64,
                                     indices_int64=ssm_state_indices.dtype == torch.int64, scale=scale,
                                     platform=platform)
    out = torch.empty((shapes["t"], shapes["nv"], shapes["dv"]), dtype=query.dtype)
    spec, _keep = _spec(shapes, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                        num_accepted_tokens, g, gk, out)
    counters = _native.run_twin(spec, plan, platform)
    return out, counters, plan
