"""FP64 reference of recurrent_gated_delta_rule, written from the contract line by line."""

from __future__ import annotations

from typing import Optional

import torch


def reference(query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
              num_accepted_tokens: Optional[torch.Tensor] = None, g: Optional[torch.Tensor] = None,
              gk: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out [T, NV, Dv], new state pool), both FP64; `state` is not modified."""
    T, NK, Dk = query.shape
    NV, Dv = value.shape[1], value.shape[2]
    group = NV // NK
    q, k, v, b = (x.double() for x in (query, key, value, beta))
    pool = state.double().clone()
    out = torch.zeros(T, NV, Dv, dtype=torch.float64)
    seq0 = 0
    for bi, n in enumerate(actual_seq_lengths.tolist()):
        if n <= 0:
            continue
        acc = int(num_accepted_tokens[bi]) if num_accepted_tokens is not None else 0
        read = int(ssm_state_indices[seq0 + acc - 1]) if 0 < acc <= n else int(ssm_state_indices[seq0])
        for h in range(NV):
            hk = h // group
            S = state.double()[read, h].clone()  # [Dv, Dk], read from the pool as it was
            for t in range(seq0, seq0 + n):
                if g is not None:
                    S = S * torch.exp(g[t, h].double())
                if gk is not None:
                    S = S * (torch.exp(gk[t, h].double())[None, :] if gk.dim() == 3 else torch.exp(gk[t, h].double()))
                d = (v[t, h] - S @ k[t, hk]) * b[t, h]
                S = S + d[:, None] * k[t, hk][None, :]
                out[t, h] = S @ (scale * q[t, hk])
                pool[int(ssm_state_indices[t]), h] = S
        seq0 += n
    return out, pool
