"""Qwen3.5 text models: Gated DeltaNet layers interleaved with gated full attention.

Three of every four layers (the config's `layer_types`) are Gated DeltaNet
linear attention: a fixed-size recurrent state per sequence (the engine's
RecurrentStatePool) instead of K/V. The others are full attention with an
output gate (q_proj yields each head's query and gate side by side) and
partial RoPE (the first head_dim * partial_rotary_factor dims; for text the
three multi-axis sections carry the same position, so they reduce to one
ordinary rotate-half RoPE). Every RMSNorm but the one inside the DeltaNet
layer is zero-centred: it scales by (1 + w).

Decode tokens run the delta rule through `torch.ops.rvascend.recurrent_gated_delta_rule`
on the state pool; prompts run the decode call's prompt form (token by token on the
op's row kernels), or with autograd the chunked form (chunked_delta_rule.py),
starting from the sequence's state when a chunked prefill continues.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from rvascend import ops
from rvascend.models.chunked_delta_rule import chunked_gated_delta_rule
from rvascend.models.config import ModelConfig
from rvascend.models.decoder import MLP, Attention, CausalLM, DecoderModel, ForwardBatch, KVPool
from rvascend.models.layers import FusedLinear, RMSNorm, RotaryEmbedding, apply_rotary, constant_parameter
from rvascend.dispatch.fused_decoder import DELTANET, GATED_ATTENTION, LayerParts
from rvascend.dispatch.kernel_routes import routes_of

# Prompts through the one native call (the conv, norms and the delta rule's rows token by
# token) instead of ATen and the chunked form's matrix products, on every CPU: on riscv64
# ATen is scalar; on x86 (Zen 4, 2 threads, Qwen3.5-0.8B-shaped BF16, the whole prompt) a
# 64-token prompt took 326 ms against the chunked form's 522 and a 512-token one 1975 ms
# against 5487. The chunked form stays for autograd (chunked_delta_rule.py).
RECURRENT_PROMPTS = True


class ZeroCenteredRMSNorm(RMSNorm):
    """RMSNorm scaling by (1 + w), in FP32, rounded once at the end (Qwen3.5, Qwen3-Next);
    routed to the elementwise kernels' zero-centred form."""

    zero_centred = True

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def torch_forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class GatedRMSNorm(nn.Module):
    """The DeltaNet output's per-head RMSNorm (plain weight), times SiLU of the gate z."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = constant_parameter(dim, 1.0)
        self.eps = eps

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * xf.to(x.dtype) * F.silu(z.float())).to(x.dtype)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        lin = config.linear_attention
        self.index = index  # among the linear-attention layers: its slot lists in the state pool
        self.nk, self.nv, self.dk, self.dv = lin.num_key_heads, lin.num_value_heads, lin.key_head_dim, lin.value_head_dim
        self.kernel = lin.conv_kernel
        key_dim, value_dim = self.nk * self.dk, self.nv * self.dv
        self.in_proj = FusedLinear(config.hidden_size, {"qkv": lin.conv_dim, "z": value_dim, "b": self.nv,
                                                        "a": self.nv}, bias=False)
        self.conv1d = nn.Conv1d(lin.conv_dim, lin.conv_dim, self.kernel, groups=lin.conv_dim, bias=False)
        self.dt_bias = constant_parameter(self.nv, 1.0)
        self.A_log = constant_parameter(self.nv, 0.0)
        self.norm = GatedRMSNorm(self.dv, config.rms_norm_eps)
        self.out_proj = nn.Linear(value_dim, config.hidden_size, bias=False)
        self.split = [lin.conv_dim, value_dim, self.nv, self.nv]
        self.qkv_split = [key_dim, key_dim, value_dim]

    def _conv(self, mixed: torch.Tensor, weight: torch.Tensor, batch: ForwardBatch, conv_pool: torch.Tensor):
        """The causal conv of every sequence's new rows, its window left in its slot (and, in a
        verify step, the window after each drafted token in that token's slot); returns the
        conv's output, the decode rows and their slots, and the prompts as (rows, prefix,
        slot, (token, slot) kept)."""
        conv_out = torch.empty_like(mixed)
        start = 0
        decode_rows, decode_slots, prompts = [], [], []  # prompts: (rows, prefix, slot, token slots)
        for n, prefix, slot in zip(batch.new_lens, batch.prefix_lens, batch.state_slots):
            x = mixed[start:start + n].transpose(0, 1)                     # [C, n]
            before = conv_pool[slot] if prefix > 0 else x.new_zeros(x.shape[0], self.kernel - 1)
            window = torch.cat((before.to(x.dtype), x), dim=1)             # [C, K - 1 + n]
            conv_pool[slot] = window[:, -(self.kernel - 1):]
            kept = [] if batch.state_token_slots is None else \
                [(j, s) for j, s in enumerate(batch.state_token_slots[start:start + n]) if s >= 0]
            for j, s in kept:  # a verify step's drafted positions: the window after token j
                conv_pool[s] = window[:, j + 1:j + self.kernel]
            # The depthwise conv as one product and sum over [C, n, K] windows: F.conv1d with
            # groups=C runs one small convolution per channel (on riscv64's scalar ATen about
            # 200M instructions per layer and token).
            taps = window.unfold(1, self.kernel, 1).float() * weight.float()[:, None, :]
            conv_out[start:start + n] = F.silu(taps.sum(-1).transpose(0, 1)).to(x.dtype)
            if n == 1 and prefix > 0:
                decode_rows.append(start)
                decode_slots.append(slot)
            else:
                prompts.append((slice(start, start + n), prefix, slot, kept))
            start += n
        return conv_out, decode_rows, decode_slots, prompts

    def forward(self, h: torch.Tensor, batch: ForwardBatch, pool: KVPool) -> torch.Tensor:
        states = pool.states
        if states is None or batch.state_slots is None:
            raise RuntimeError("a Gated DeltaNet layer needs the batch's recurrent-state slots (pool.states)")
        conv_pool, ssm_pool = states.conv[self.index], states.ssm[self.index]
        t = h.shape[0]
        mixed, z, b, a = self.in_proj(h).split(self.split, dim=-1)
        weight = self.conv1d.weight[:, 0]                                  # [C, K]
        if self._one_native_call(batch, mixed, conv_pool, weight):
            # From the conv to the gated norm in one call: every sequence decodes one token, or
            # (RECURRENT_PROMPTS) prompts too, from zeroed slots for a prompt's first chunk.
            from rvascend.ops.recurrent_gated_delta_rule import deltanet_decode

            index = batch.recurrent_index()
            for slot in index.starting:
                conv_pool[slot].zero_()
                ssm_pool[slot].zero_()
            return self.out_proj(deltanet_decode(
                mixed, z, b, a, conv_pool, weight, self.A_log, self.dt_bias, self.norm.weight, self.norm.eps,
                ssm_pool, index.slots, self.nk, index.lengths, index.read_slots, index.token_slots))
        if batch.state_read_slots is not None:
            # The torch form updates in place: the states move to the written slots first.
            for w, r, p in zip(batch.state_slots, batch.state_read_slots, batch.prefix_lens):
                if p > 0 and w != r:
                    conv_pool[w] = conv_pool[r]
                    ssm_pool[w] = ssm_pool[r]
        beta = b.sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        conv_out, decode_rows, decode_slots, prompts = self._conv(mixed, weight, batch, conv_pool)
        q, k, v = conv_out.float().split(self.qkv_split, dim=-1)
        q = _l2norm(q.reshape(t, self.nk, self.dk)) * self.dk ** -0.5
        k = _l2norm(k.reshape(t, self.nk, self.dk))
        v = v.reshape(t, self.nv, self.dv)
        core = torch.empty(t, self.nv, self.dv, dtype=torch.float32)
        if decode_rows:
            # Imported here: the op's extension (_recurrent_gated_delta_rule) is needed only by
            # models that have these layers.
            from rvascend.ops.recurrent_gated_delta_rule import recurrent_gated_delta_rule

            rows = torch.tensor(decode_rows)
            core[rows] = recurrent_gated_delta_rule(
                q[rows].contiguous(), k[rows].contiguous(), v[rows].contiguous(), ssm_pool, beta[rows].contiguous(),
                1.0, torch.ones(len(rows), dtype=torch.int64), torch.tensor(decode_slots, dtype=torch.int64),
                g=g[rows].contiguous())
        group = self.nv // self.nk
        for rows, prefix, slot, kept in prompts:
            state = ssm_pool[slot].transpose(-1, -2) if prefix > 0 else torch.zeros(self.nv, self.dk, self.dv)
            # In pieces that end where a token's state is kept, the last piece ending the row.
            ends = [(j + 1, s) for j, s in kept] + [(rows.stop - rows.start, slot)]
            first = rows.start
            for end, keep in ends:
                s = slice(first, rows.start + end)
                out, state = chunked_gated_delta_rule(
                    q[s].repeat_interleave(group, 1).transpose(0, 1), k[s].repeat_interleave(group, 1).transpose(0, 1),
                    v[s].transpose(0, 1), g[s].transpose(0, 1), beta[s].transpose(0, 1), state)
                core[s] = out.transpose(0, 1)
                ssm_pool[keep] = state.transpose(-1, -2)
                first = s.stop
        core = self.norm(core.to(h.dtype), z.reshape(t, self.nv, self.dv))
        return self.out_proj(core.reshape(t, self.nv * self.dv))

    def _one_native_call(self, batch: ForwardBatch, mixed: torch.Tensor, conv_pool: torch.Tensor,
                         weight: torch.Tensor) -> bool:
        """Whether this step can take deltanet_decode: one token after a prefix for every sequence
        (any tokens with RECURRENT_PROMPTS), no autograd, and one dtype for the inputs, the conv
        state and the layer's parameters."""
        if torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters()):
            return False
        if not RECURRENT_PROMPTS and batch.recurrent_index().lengths is not None:
            return False
        return all(x.dtype == mixed.dtype for x in (conv_pool, weight, self.A_log, self.dt_bias, self.norm.weight))


class GatedAttention(Attention):
    """Full attention with an output gate and partial RoPE; K/V in the pool's layer `index`."""

    rvv_kernels = ("kv_pool_attention", "rope", "sigmoid_mul")

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__(config, index)
        self.qkv_proj = FusedLinear(config.hidden_size, {
            "q": 2 * self.heads * self.head_dim, "k": self.kv_heads * self.head_dim,
            "v": self.kv_heads * self.head_dim}, bias=config.attention_bias)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, config.rms_norm_eps)
        self.rotary_dim = config.rotary_dim

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: ForwardBatch,
                pool: KVPool) -> torch.Tensor:
        t, d = h.shape[0], self.head_dim
        qg, k, v = self.qkv_proj(h).split(
            [2 * self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        routes = routes_of(self)
        if routes is not None and routes.use("rope", qg, k, cos, self.q_norm.weight, self.k_norm.weight, rows=t):
            # The zero-centred q/k norms and the partial RoPE in one pass each, the query
            # read in place beside its gate.
            q = ops.elementwise.rope(qg, self.heads, self.q_norm.weight, self.q_norm.eps, cos, sin,
                                     zero_centred=True, head_dim=d)
            k = ops.elementwise.rope(k, self.kv_heads, self.k_norm.weight, self.k_norm.eps, cos, sin,
                                     zero_centred=True)
        else:
            q = self._rope(self.q_norm(qg.reshape(t, self.heads, 2 * d)[..., :d]), cos, sin)
            k = self._rope(self.k_norm(k.reshape(t, self.kv_heads, d)), cos, sin)
        out = self.attend(q.contiguous(), k.contiguous(), v.reshape(t, self.kv_heads, d).contiguous(), batch, pool)
        if routes is not None and routes.use("sigmoid_mul", out, qg, rows=t):
            return self.o_proj(ops.elementwise.sigmoid_mul(out, qg[:, d:], self.heads, 2 * d))
        gate = qg.reshape(t, self.heads, 2 * d)[..., d:].reshape(t, self.heads * d)
        return self.o_proj(out * torch.sigmoid(gate))

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        r = self.rotary_dim
        return torch.cat((apply_rotary(x[..., :r], cos, sin), x[..., r:]), dim=-1)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, kind: str, index: int) -> None:
        super().__init__()
        self.kind = kind
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        if kind == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, index)
        else:
            self.self_attn = GatedAttention(config, index)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, h, residual, cos, sin, batch, pool):
        x, residual = self.input_layernorm.add_forward(h, residual)
        mixed = self.linear_attn(x, batch, pool) if self.kind == "linear_attention" else \
            self.self_attn(x, cos, sin, batch, pool)
        x, residual = self.post_attention_layernorm.add_forward(mixed, residual)
        return self.mlp(x), residual

    def describe(self) -> LayerParts:
        """Its parts for the fused step (dispatch/fused_decoder.py): a Gated DeltaNet layer
        (its conv and delta-rule state in the state pool's layer `index`) or gated attention."""
        mlp = (self.mlp.gate_up_proj, self.mlp.down_proj)
        if self.kind == "linear_attention":
            mixer = self.linear_attn
            return LayerParts(DELTANET, self.input_layernorm, self.post_attention_layernorm,
                              (mixer.in_proj, mixer.out_proj) + mlp, None, None, mixer.index, mixer)
        attn = self.self_attn
        return LayerParts(GATED_ATTENTION, self.input_layernorm, self.post_attention_layernorm,
                          (attn.qkv_proj, attn.o_proj) + mlp, attn.q_norm, attn.k_norm, attn.layer, attn)


class Qwen3_5CausalLM(CausalLM):
    """Qwen3.5 (dense text) for causal LM, with CausalLM's batch, pool and logits contract."""

    rvv_fused_decoder = True  # both layer kinds run in the fused decode step (dispatch/fused_decoder.py)

    STACKED = {**CausalLM.STACKED, "in_proj_qkv": ("in_proj", "qkv"), "in_proj_z": ("in_proj", "z"),
               "in_proj_b": ("in_proj", "b"), "in_proj_a": ("in_proj", "a")}

    def __init__(self, config: ModelConfig) -> None:
        nn.Module.__init__(self)
        self.config = config
        self.model = DecoderModel.__new__(DecoderModel)
        nn.Module.__init__(self.model)
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        counters = {"linear_attention": 0, "full_attention": 0}
        layers = []
        for kind in config.layer_types:
            layers.append(HybridDecoderLayer(config, kind, counters[kind]))
            counters[kind] += 1
        self.model.layers = nn.ModuleList(layers)
        self.model.norm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.lm_head = self.model.embed_tokens if config.tie_word_embeddings else \
            nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.mtp = None  # the MTP head, when loaded (models/qwen3_5_mtp.py add_mtp_head)
