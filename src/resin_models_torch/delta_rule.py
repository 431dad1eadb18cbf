"""The gated delta rule of linear-attention layers (Gated DeltaNet), in float32, for one
sequence: a recurrent form (one token at a time, the definition) and a chunked form (the same
result through a triangular solve per chunk, for prefill), plus `delta_rule_rows`, which runs
a step's rows against the State group's pages.

Per head, with the state S [K, V], for every token t (q already l2-normed and scaled):
    S <- S * exp(g_t)                       (g <= 0: a decay in log space, per head for Gated
                                             DeltaNet, per key channel for KDA)
    S <- S + k_t (beta_t (v_t - S^T k_t))^T (the delta rule: write the correction only)
    o_t = S^T q_t

Shapes for one sequence: q, k [L, H, K]; v [L, H, V]; beta [L, H]; g [L, H] (per head) or
[L, H, K] (per key channel); state [H, K, V].
"""

from __future__ import annotations

import torch

from resin_models_torch.batch import StateBatch


def recurrent_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token by token. Returns (o [L, H, V], final state [H, K, V])."""
    out = torch.empty_like(v)
    for t in range(q.shape[0]):
        decay = g[t].exp()
        state = state * (decay[:, None, None] if decay.dim() == 1 else decay[:, :, None])
        predicted = torch.einsum("hk,hkv->hv", k[t], state)
        correction = (v[t] - predicted) * beta[t][:, None]
        state = state + k[t][:, :, None] * correction[:, None, :]
        out[t] = torch.einsum("hk,hkv->hv", q[t], state)
    return out, state


def chunked_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, `chunk` tokens at a time (the last chunk may be shorter).

    Inside a chunk, with G_i the cumulative log decay up to token i and D_ij = exp(G_i - G_j):
    the writes of the chunk's tokens interact through the unit lower-triangular system
    (I + tril(beta_i k_i.k_j D_ij, -1)) X = rhs, solved once for the values (beta v) and for
    the decayed keys (beta k exp(G)); the corrections are then U - W S, the outputs
    (q exp(G)) S + tril(q_i.k_j D_ij) (U - W S), and the next state
    exp(G_last) S + (k exp(G_last - G))^T (U - W S). With a decay per key channel, D_ij is
    per channel too and sits inside the k_i.k_j and q_i.k_j products.
    """
    if g.dim() == 3:
        return _chunked_per_channel(q, k, v, g, beta, state, chunk)
    length = q.shape[0]
    out = torch.empty_like(v)
    qh, kh, vh = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [H, L, *]
    gh, bh = g.transpose(0, 1), beta.transpose(0, 1)  # [H, L]
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        qc, kc, vc = qh[:, start:end], kh[:, start:end], vh[:, start:end]
        bc = bh[:, start:end, None]
        cum = gh[:, start:end].cumsum(dim=-1)  # [H, C]
        n = end - start
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (cum[:, :, None] - cum[:, None, :]).masked_fill(~lower, float("-inf")).exp()
        system = (bc * kc) @ kc.transpose(-1, -2) * decay
        system = system.tril(-1) + torch.eye(n, dtype=q.dtype, device=q.device)
        u = torch.linalg.solve_triangular(system, bc * vc, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(
            system, bc * kc * cum.exp()[..., None], upper=False, unitriangular=True
        )
        corrections = u - w @ state
        scores = (qc @ kc.transpose(-1, -2)) * decay
        out[start:end] = ((qc * cum.exp()[..., None]) @ state + scores @ corrections).transpose(
            0, 1
        )
        last = cum[:, -1:]
        state = (
            state * last.exp()[..., None]
            + (kc * (last - cum).exp()[..., None]).transpose(-1, -2) @ corrections
        )
    return out, state


def _chunked_per_channel(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    length = q.shape[0]
    out = torch.empty_like(v)
    qh, kh, vh, gh = (x.transpose(0, 1) for x in (q, k, v, g))  # [H, L, *]
    bh = beta.transpose(0, 1)
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        qc, kc, vc, bc = (
            qh[:, start:end],
            kh[:, start:end],
            vh[:, start:end],
            bh[:, start:end, None],
        )
        cum = gh[:, start:end].cumsum(dim=1)  # [H, C, K]
        n = end - start
        lower = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        pair = cum[:, :, None, :] - cum[:, None, :, :]  # [H, C, C, K]: G_i - G_j per channel
        decay = pair.masked_fill(~lower[..., None], float("-inf")).exp()
        system = torch.einsum("hik,hjk,hijk->hij", bc * kc, kc, decay)
        system = system.tril(-1) + torch.eye(n, dtype=q.dtype, device=q.device)
        u = torch.linalg.solve_triangular(system, bc * vc, upper=False, unitriangular=True)
        w = torch.linalg.solve_triangular(
            system, bc * kc * cum.exp(), upper=False, unitriangular=True
        )
        corrections = u - w @ state
        scores = torch.einsum("hik,hjk,hijk->hij", qc, kc, decay)
        out[start:end] = ((qc * cum.exp()) @ state + scores @ corrections).transpose(0, 1)
        last = cum[:, -1:]
        state = (
            state * last[:, 0, :, None].exp()
            + (kc * (last - cum).exp()).transpose(-1, -2) @ corrections
        )
    return out, state


def delta_rule_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    states: torch.Tensor,
    batch: StateBatch,
    chunk: int | None = 64,
) -> torch.Tensor:
    """Run every row of a step from its input checkpoint (`states` [pages, H, K, V] float32,
    this layer's view of the State group), storing the state after the row's last token and
    after every requested checkpoint token. Flat inputs [T, ...] in float32; returns o [T, H, V].

    A row is cut at its checkpoint tokens, so each checkpoint is an exact state, not a chunk
    boundary's. Pieces of one token use the recurrent form, longer ones the chunked form
    (`chunk=None`: always recurrent). Every input state is read before anything is written.
    """
    rows = batch.query_index.shape[0]
    lens = batch.query_valid.sum(dim=1).tolist()
    index = batch.query_index.tolist()
    state_in = batch.state_in.tolist()
    initial = [
        states[page].clone() if page >= 0 else states.new_zeros(states.shape[1:])
        for page in state_in
    ]
    # state_batch lays checkpoint windows out as local + 1 + span: the first column is the
    # number of the row's tokens the checkpoint covers.
    cuts: list[list[tuple[int, int]]] = [[] for _ in range(rows)]
    for row, first, page in zip(
        batch.checkpoint_rows.tolist(),
        batch.checkpoint_window[:, 0].tolist(),
        batch.checkpoint_pages.tolist(),
        strict=True,
    ):
        cuts[row].append((first, page))
    out = torch.zeros_like(v)
    finals: list[torch.Tensor] = []
    writes: list[tuple[int, torch.Tensor]] = []
    for row in range(rows):
        state = initial[row]
        tokens = torch.tensor(index[row][: lens[row]], dtype=torch.long, device=q.device)
        start = 0
        for end, page in [*sorted(cuts[row]), (lens[row], -1)]:
            if end > start:
                piece = tokens[start:end]
                args = (q[piece], k[piece], v[piece], g[piece], beta[piece], state)
                if chunk is None or end - start == 1:
                    o, state = recurrent_delta_rule(*args)
                else:
                    o, state = chunked_delta_rule(*args, chunk=chunk)
                out[piece] = o
                start = end
            if page >= 0:
                writes.append((page, state))
        finals.append(state)
    for page, state in writes:
        states[page] = state
    for row, page in zip(batch.state_rows.tolist(), batch.state_out.tolist(), strict=True):
        states[page] = finals[row]
    return out
