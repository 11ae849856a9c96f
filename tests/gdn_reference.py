"""The gated delta rule in float64, token by token: the reference of gdn_decode's tests
and of gdn_extend's (the same recurrence over packed variable-length sequences)."""

from __future__ import annotations

import itertools

import torch


def softplus(x: torch.Tensor) -> torch.Tensor:
    """log(1 + e^x), and x itself above 20 (the original's and torch's threshold)."""
    return torch.where(x > 20, x, torch.log1p(torch.exp(x.clamp(max=20))))


def gates(
    *,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(g, beta)`` in float64: the log decay -exp(A_log) softplus(a + dt_bias) unless
    ``g`` is given, the update gate sigmoid(b) unless ``beta`` is."""
    if g is None:
        g = -torch.exp(A_log.double()) * softplus(a.double() + dt_bias.double())
    if beta is None:
        beta = torch.sigmoid(b.double())
    return g.double(), beta.double()


def gdn_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    *,
    a: torch.Tensor | None = None,
    b: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    keep_states: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(o, new_pool, states)`` in float64 for gdn_decode's arguments (one token per
    sequence when ``q`` is ``[B, H, K]``, else ``[B, T, H, K]``): ``o`` shaped like ``v``,
    the pool after the call, and the state after each token ``[B, T, HV, V, K]`` (None
    unless ``keep_states``: 64 GiB for one sequence of 16384 tokens of 32 heads).

    A negative index starts from zeros and leaves the pool; an index past the pool's end
    starts from NaN and leaves it too.
    """
    one_token = q.dim() == 3
    if one_token:
        q, k, v = q[:, None], k[:, None], v[:, None]
        a, b, g, beta = (x[:, None] if x is not None else None for x in (a, b, g, beta))
    q, k, v = q.double(), k.double(), v.double()
    batch, tokens, heads, dim_k = q.shape
    value_heads = v.shape[2]
    if use_qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (dim_k**-0.5 if scale is None else scale)
    # value head j reads key head j // (HV // H)
    q = q.repeat_interleave(value_heads // heads, dim=2)
    k = k.repeat_interleave(value_heads // heads, dim=2)
    g, beta = gates(a=a, b=b, A_log=A_log, dt_bias=dt_bias, g=g, beta=beta)

    pool = state_pool.double().clone()
    index = cache_indices.long()
    held = (index >= 0) & (index < pool.shape[0])
    state = torch.zeros(batch, value_heads, *pool.shape[2:], dtype=torch.float64, device=q.device)
    state[held] = pool[index[held]]
    state[index >= pool.shape[0]] = float("nan")
    o = torch.empty_like(v)
    states = None
    if keep_states:
        states = torch.empty(batch, tokens, *state.shape[1:], dtype=torch.float64, device=q.device)
    for t in range(tokens):
        state = state * torch.exp(g[:, t])[..., None, None]
        kv = torch.einsum("nhvk,nhk->nhv", state, k[:, t])
        u = beta[:, t][..., None] * (v[:, t] - kv)
        state = state + u[..., None] * k[:, t, :, None, :]
        o[:, t] = torch.einsum("nhvk,nhk->nhv", state, q[:, t])
        if keep_states:
            states[:, t] = state
    pool[index[held]] = state[held]
    return (o[:, 0] if one_token else o), pool, states


def gdn_extend_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    **gate_args: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, new_pool)`` in float64 for gdn_extend's arguments: the packed sequences
    (``q`` ``[total_tokens, H, K]``, ``cu_seqlens`` ``[N + 1]``) as a padded batch for
    gdn_reference, the padding inert (no decay, beta 0: the state stays as it is).
    ``o`` is ``[total_tokens, HV, V]``, NaN at rows outside every sequence; ``gate_args``
    are a, b, A_log, dt_bias, g, beta as gdn_reference takes them.
    """
    g, beta = gates(**gate_args)
    bounds = cu_seqlens.long().tolist()
    lengths = [end - start for start, end in itertools.pairwise(bounds)]
    batch, longest = len(lengths), max(lengths, default=0)
    rows = torch.full((batch, longest), -1, dtype=torch.long)
    for n, (start, length) in enumerate(zip(bounds, lengths, strict=False)):
        rows[n, :length] = torch.arange(start, start + length)
    rows = rows.to(q.device)
    valid = rows >= 0

    def padded(x: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        out = x.double()[rows.clamp(min=0)]
        out[~valid] = fill
        return out

    o, pool, _ = gdn_reference(
        padded(q), padded(k), padded(v), state_pool, cache_indices, g=padded(g),
        beta=padded(beta), scale=scale, use_qk_l2norm=use_qk_l2norm, keep_states=False,
    )  # fmt: skip
    packed = torch.full((q.shape[0], *v.shape[1:]), float("nan"), dtype=torch.float64)
    packed = packed.to(q.device)
    packed[rows[valid]] = o[valid]
    return packed, pool


def split_chunk(
    state: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(o, new_state)`` of one chunk in float64 by the split path's algebra (kernel A's
    state-free factors, then kernel B's products with the state), for a ``V x K`` state
    and ``C`` tokens of normalised, scaled ``q`` and normalised ``k`` ``[C, K]``, ``v``
    ``[C, V]``, log decays ``g`` and gates ``beta`` ``[C]``::

        G  = cumsum(g)                                 # kernel A
        A  = strictly_lower(beta_j e^{G_j - G_i} k_j . k_i)[j, i]
        T' = (I + A)^-1 diag(beta)
        P  = lower(e^{G_i - G_j} q_i . k_j)[i, j]
        d  = T' (v - e^G (k S0^T))                     # kernel B: d^T = (v^T - ...) T'^T
        o  = e^G (q S0^T) + P d
        S  = e^{G_last} S0 + (e^{G_last - G} d)^T k
    """
    G = torch.cumsum(g, 0)
    gaps = G[:, None] - G[None, :]
    causal = torch.ones_like(gaps, dtype=torch.bool).tril()
    decay = torch.where(causal, torch.exp(gaps.masked_fill(~causal, 0)), 0)
    A = (beta[:, None] * decay * (k @ k.T)).tril(-1)
    T = torch.linalg.inv(torch.eye(len(g), dtype=A.dtype, device=A.device) + A) * beta[None, :]
    P = decay * (q @ k.T)
    d = T @ (v - torch.exp(G)[:, None] * (k @ state.T))
    o = torch.exp(G)[:, None] * (q @ state.T) + P @ d
    new_state = torch.exp(G[-1]) * state + (torch.exp(G[-1] - G)[:, None] * d).T @ k
    return o, new_state
