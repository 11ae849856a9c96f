"""The gated delta net (GDN) of Qwen3-Next / Qwen3.5 linear attention over a pool of
per-sequence states: the recurrent decode step, and the chunked extend (prefill) over
packed variable-length sequences."""

from __future__ import annotations

import torch

from mllm_kernel.ops.op import Op, like


def gdn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    state_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    intermediate_states: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One or a few decode tokens of the gated delta rule per sequence, on the states
    ``state_pool[cache_indices]`` (updated in place); returns the output ``o``, shaped
    and typed like ``v``. The original mllm-kernel's call, unchanged::

        o = gdn_decode(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices)

    Shapes (``T`` tokens per sequence, ``H`` key heads, ``HV`` value heads, a multiple
    of ``H``; ``K``, ``V`` the head dims, each 64, 128 or 256):

    * ``q``, ``k``: ``[B, H, K]`` (one token, the original's layout) or ``[B, T, H, K]``
      (``T`` tokens, speculative verify), float16 or bfloat16; ``v``: ``[B, HV, V]`` or
      ``[B, T, HV, V]``, the same dtype. Any strides with a contiguous last dim.
    * ``a``, ``b`` (and ``g``, ``beta``): ``[B, HV]`` or ``[B, T, HV]``; ``A_log``,
      ``dt_bias``: ``[HV]``. Each float32, float16 or bfloat16, any strides.
    * ``state_pool``: ``[pool_size, HV, V, K]`` (each state ``V x K``, row-major),
      float32 or bfloat16; the last two dims contiguous, 16-byte aligned.
    * ``cache_indices``: ``[B]`` int32 or int64, distinct: sequence ``n``'s state is
      ``state_pool[cache_indices[n]]``. A negative index (the padding id -1) means no
      state: the sequence starts from zeros and nothing is written to the pool. An index
      ``>= pool_size`` touches nothing and gives NaN outputs (with
      ``MLLM_KERNEL_CHECK_BOUNDS=1``: IndexError after the kernel).

    For each sequence ``n``, value head ``j`` (key head ``i = j // (HV // H)``) and
    token ``t`` in order, in float32, with ``S`` the ``V x K`` state::

        g     = -exp(A_log[j]) * softplus(a[n, t, j] + dt_bias[j])   # softplus(x) = x for x > 20
        beta  = sigmoid(b[n, t, j])
        q_t   = q[n, t, i] / sqrt(sum(q[n, t, i] ** 2) + 1e-6) * scale  # scale=None: K ** -0.5
        k_t   = k[n, t, i] / sqrt(sum(k[n, t, i] ** 2) + 1e-6)
        S     = exp(g) * S
        u     = beta * (v[n, t, j] - S @ k_t)                        # [V]
        S     = S + outer(u, k_t)
        o[n, t, j] = S @ q_t

    ``use_qk_l2norm=False`` skips the two normalisations (q is still scaled). Instead of
    ``a``, ``A_log``, ``dt_bias`` (pass None for all three) the log decay may come
    precomputed as ``g=``; instead of ``b`` (None), ``beta=`` itself: the two gates are
    chosen independently, and giving both forms of one is a ValueError. A log decay
    below -100 (-inf among them: a decay of 0, a state reset) is taken as -100, whose
    decay e^-100 leaves nothing of an fp32 state; gdn_extend's chunks subtract running
    sums of them, where -inf would give NaN.

    The state is carried in float32 through the ``T`` tokens and rounded to the pool's
    dtype when stored. ``intermediate_states``: optional ``[B, T, HV, V, K]`` buffer of
    the pool's dtype (last two dims contiguous), written with the state after each token
    (padded sequences included): what speculative decoding keeps to roll back to an
    accepted token. ``out``: written in place if given (``v``'s shape and dtype, a
    contiguous last dim). No output may overlap an input.
    """


GDN_DECODE = Op(
    gdn_decode,
    out="out",
    fake=like("v"),
    writes=("state_pool", "intermediate_states"),
)


def gdn_extend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor | None,
    b: torch.Tensor | None,
    A_log: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    state_pool: torch.Tensor,
    cache_indices: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    g: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float | None = None,
    use_qk_l2norm: bool = True,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The gated delta rule over packed variable-length sequences (prefill / extend):
    gdn_decode's recurrence, token by token in each sequence, on the states
    ``state_pool[cache_indices]`` (updated in place with each sequence's final state);
    returns the output ``o``, shaped and typed like ``v``. The original mllm-kernel's
    ``gdn_extend_chunkwise`` call, unchanged::

        o = gdn_extend(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens)

    Shapes (``N`` sequences packed into ``total_tokens`` rows; ``H``, ``HV``, ``K``, ``V``
    as for gdn_decode, ``K`` and ``V`` each 64, 128 or 256):

    * ``q``, ``k``: ``[total_tokens, H, K]``, float16 or bfloat16; ``v``:
      ``[total_tokens, HV, V]``, the same dtype. Any strides with a contiguous last dim.
    * ``a``, ``b`` (and ``g``, ``beta``): ``[total_tokens, HV]``; ``A_log``, ``dt_bias``:
      ``[HV]``. Each float32, float16 or bfloat16, any strides.
    * ``state_pool``: ``[pool_size, HV, V, K]``, float32 or bfloat16, the last two dims
      contiguous, each state 16-byte aligned.
    * ``cache_indices``: ``[N]`` int32 or int64, distinct, with gdn_decode's rules: a
      negative index (-1) starts its sequence from zeros and writes nothing to the pool;
      one ``>= pool_size`` touches nothing and gives NaN outputs (with
      ``MLLM_KERNEL_CHECK_BOUNDS=1``: IndexError after the kernel).
    * ``cu_seqlens``: ``[N + 1]`` int32 or int64, nondecreasing: sequence ``n`` is rows
      ``cu_seqlens[n]`` to ``cu_seqlens[n + 1]`` (exclusive) of the packed tensors. An
      empty sequence leaves its state as it is. A sequence whose range is not within
      ``[0, total_tokens]`` is skipped (with ``MLLM_KERNEL_CHECK_BOUNDS=1``: IndexError);
      rows outside every sequence are not written. A decreasing entry is a caller's bug
      the kernels cannot see: the sequences beside it overlap, and their results and
      states are undefined (the check would cost a device-to-host copy each call).

    For each sequence, value head and token in order, exactly gdn_decode's step (its
    docstring): the state decays by ``exp(g)``, takes ``beta (v - S k) k^T`` with the L2
    normalised ``k``, and gives ``o = S q`` with the normalised ``q`` times ``scale``
    (None: ``K ** -0.5``); ``use_qk_l2norm=False`` skips the normalisations. The gates
    come from ``a``, ``A_log``, ``dt_bias`` and ``b``, or precomputed as ``g=`` and
    ``beta=`` (the other form None; both forms of one gate is a ValueError).

    The state is carried in float32 from the first token to the last, computed a chunk of
    64 tokens at a time (within float32 rounding of the token-by-token recurrence), and
    rounded to the pool's dtype when stored. ``out``: written in place if given (``v``'s
    shape and dtype, a contiguous last dim). No output may overlap an input.
    """


GDN_EXTEND = Op(gdn_extend, out="out", fake=like("v"), writes=("state_pool",))
