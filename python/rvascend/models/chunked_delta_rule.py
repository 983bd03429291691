"""The gated delta rule over many tokens of one sequence, a chunk of tokens at a time.

Per value head, with the state S ([Dk, Dv] here), log decays g_t <= 0 and
rates beta_t, token t does

    S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;  o_t = S^T q_t.

Within a chunk, with G_i the decay summed from the chunk's start to token i
and S0 the state before the chunk, the updates u solve a unit lower-triangular
system,

    u_i + beta_i sum_{j<i} exp(G_i - G_j) (k_i . k_j) u_j = beta_i (v_i - exp(G_i) S0^T k_i),

after which the outputs and the state at the chunk's end are two matrix
products each:

    o_i = exp(G_i) S0^T q_i + sum_{j<=i} exp(G_i - G_j) (q_i . k_j) u_j,
    S_end = exp(G_last) S0 + sum_j exp(G_last - G_j) k_j u_j^T.

So a prompt costs a few GEMMs per chunk instead of a rank-one update per token.
The decode path is the project's op (ops/recurrent_gated_delta_rule.py); both are checked
against transformers' `torch_recurrent_gated_delta_rule` in qwen3_5_test.py.
"""

from __future__ import annotations

import torch

CHUNK = 64


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                             state: torch.Tensor, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k [H, n, Dk] (normalised, q already scaled); v [H, n, Dv]; g, beta [H, n]; state
    [H, Dk, Dv]; all FP32, heads already matched (GQA expanded). Returns (out [H, n, Dv], state)."""
    heads, n, _ = k.shape
    out = torch.empty_like(v)
    for start in range(0, n, chunk):
        end = min(start + chunk, n)
        qc, kc, vc, bc = q[:, start:end], k[:, start:end], v[:, start:end], beta[:, start:end]
        G = g[:, start:end].cumsum(-1)                                  # [H, c]
        c = end - start
        lower = torch.ones(c, c, dtype=torch.bool).tril()
        # exp(G_i - G_j) where j <= i, else 0 (masked before exp: no overflow above the diagonal)
        decay = torch.exp((G[:, :, None] - G[:, None, :]).masked_fill(~lower, float("-inf")))
        strict = decay * (~torch.eye(c, dtype=torch.bool))
        system = torch.eye(c) + bc[:, :, None] * strict * (kc @ kc.transpose(-1, -2))
        rhs = bc[:, :, None] * (vc - torch.exp(G)[:, :, None] * (kc @ state))
        u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        out[:, start:end] = torch.exp(G)[:, :, None] * (qc @ state) + (decay * (qc @ kc.transpose(-1, -2))) @ u
        last = G[:, -1:]                                                # [H, 1]
        state = torch.exp(last)[:, :, None] * state + (torch.exp(last - G)[:, :, None] * kc).transpose(-1, -2) @ u
    return out, state
