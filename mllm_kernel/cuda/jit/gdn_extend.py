"""gdn_extend on the GPU (declared in :mod:`mllm_kernel.ops.gdn`): the gated delta net
over packed variable-length sequences, a chunk of 64 tokens at a time on tensor cores::

    from mllm_kernel.cuda.jit import gdn_extend

    o = gdn_extend(q, k, v, a, b, A_log, dt_bias, state_pool, cache_indices, cu_seqlens)

Two paths give the same results: the fused kernel (gdn_extend.cu), where one CTA walks a
sequence's chunks doing all of each chunk's work, and the split path
(gdn_extend_split.cu) for long sequences, where the state-free work of every chunk runs
in parallel first and the walk does only the products with the state. With few sequences
and heads the split path also cuts each walk into segments walked at once (the segmented
walk: gdn_extend_split.cu's design note). :func:`use_split_path` and
:func:`segment_chunks` choose.

The original mllm-kernel's module path and name, ``gdn_extend_chunkwise``, are
:mod:`mllm_kernel.cuda.jit.gdn_extend_chunkwise`.
"""

from __future__ import annotations

import torch

from mllm_kernel.cuda.device_facts import device_facts
from mllm_kernel.cuda.jit.bounds_check import raise_if_counted
from mllm_kernel.jit_utils import env
from mllm_kernel.jit_utils.cuda_arch import AMPERE_OR_NEWER
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.ops.gdn import GDN_EXTEND

_GDN_EXTEND = KernelModule(
    "gdn_extend",
    device="cuda",
    sources=["gdn_extend.cu", "gdn_extend_split.cu"],
    exports=[
        "gdn_extend",
        "gdn_extend_split",
        "gdn_extend_workspace_bytes",
        "gdn_extend_split_fits",
    ],
    archs=AMPERE_OR_NEWER,
)

# "fused" or "split" makes every call take that path, "segments" the split path with
# segments of _FORCED_SEGMENT_CHUNKS chunks (the tests run each); None: use_split_path
# and segment_chunks decide. Internal, not an argument of the op.
_force_path: str | None = None
_FORCED_SEGMENT_CHUNKS = 2

# The split path's thresholds, first estimates from the per-chunk costs (the fused walk
# ~16 us a chunk, its CTAs 3 an SM; the split walk a few us a chunk, a CTA an SM, after
# one parallel pass): benchmarks/bench_gdn.py --extend times both paths to tune them.
_SPLIT_MIN_CHUNKS = 16  # average chunks (64 tokens) a sequence
_SPLIT_MAX_CTAS_PER_SM = 4  # of the fused kernel, which runs 3 an SM at once


def use_split_path(
    total_tokens: int,
    num_sequences: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    sm_count: int,
) -> bool:
    """Whether gdn_extend takes the split path for a call of these sizes: when its
    sequences are long (``_SPLIT_MIN_CHUNKS`` chunks on average: the fused kernel walks
    each in one CTA, a chunk at a time) and the fused kernel would have few CTAs an SM (at
    most ``_SPLIT_MAX_CTAS_PER_SM``: with many, they hide each other's latency and the
    split path's extra pass over memory costs more than it saves). Not for head_k_dim 256,
    where the split walk's state spills registers and its float16 stage needs more shared
    memory than sm_80-89 GPUs have.

    >>> use_split_path(65536, 1, 32, 128, 128, 132), use_split_path(4096, 64, 32, 128, 128, 132)
    (True, False)
    """
    fused_ctas = num_sequences * num_v_heads * (head_v_dim // 32)
    long_sequences = total_tokens >= _SPLIT_MIN_CHUNKS * 64 * max(num_sequences, 1)
    few_ctas = fused_ctas <= _SPLIT_MAX_CTAS_PER_SM * sm_count
    return long_sequences and few_ctas and head_k_dim <= 128


# The segmented walk's rule (benchmarks/bench_gdn.py --extend --segments times forced
# segment lengths; on an H200's TP8 slice 4 segments were the fastest of 2, 4, 5, 8 and
# 16 at 8192 tokens and of 4, 5, 8, 16 and 32 at 65536: benchmarks/RESULTS.md): segments
# only where the walks are fewer than _SEGMENT_BELOW_CTAS_PER_SM an
# SM; as many as keep the output walks in one wave of _SEGMENT_OUTPUT_CTAS_PER_SM an SM
# (their two-stage CTAs fit one an SM) and the end walks in one wave of
# _SEGMENT_END_CTAS_PER_SM (theirs, without q's rows, fit two): a second wave doubles a
# walk's time; and none shorter than _SEGMENT_MIN_CHUNKS (each adds a step to the
# combine and an end walk's fixed cost).
_SEGMENT_BELOW_CTAS_PER_SM = 0.5
_SEGMENT_OUTPUT_CTAS_PER_SM = 1
_SEGMENT_END_CTAS_PER_SM = 2
_SEGMENT_MIN_CHUNKS = 8


def segment_chunks(
    total_tokens: int,
    num_sequences: int,
    num_v_heads: int,
    head_k_dim: int,
    head_v_dim: int,
    sm_count: int,
) -> int:
    """The segment length, in chunks of 64 tokens, of the split path's walks for a call
    of these sizes; 0 for walks in one run. A walk is one CTA per 32 state rows of a
    sequence's head, walking its chunks in order: where there are fewer such CTAs than
    half the SMs, each sequence is cut into as many segments as keep both launches of
    the segmented walk within one wave (the output walks: a CTA per segment and 32 state
    rows, one an SM; the end walks, for every segment but the last: a CTA per 32 rows of
    the state and of the K x K transition, two an SM), of at least
    ``_SEGMENT_MIN_CHUNKS`` chunks.

    >>> segment_chunks(65536, 1, 8, 128, 128, 132), segment_chunks(65536, 1, 32, 128, 128, 132)
    (256, 0)
    """
    sequences = max(num_sequences, 1)
    walks = sequences * num_v_heads * (head_v_dim // 32)
    if walks == 0 or walks >= _SEGMENT_BELOW_CTAS_PER_SM * sm_count:
        return 0
    end_walks = sequences * num_v_heads * ((head_v_dim + head_k_dim) // 32)
    segments = min(
        _SEGMENT_OUTPUT_CTAS_PER_SM * sm_count // walks,
        1 + _SEGMENT_END_CTAS_PER_SM * sm_count // end_walks,
    )
    chunks = -(-total_tokens // 64)
    length = max(_SEGMENT_MIN_CHUNKS, -(-chunks // (sequences * segments)))
    return 0 if segments < 2 or length >= chunks else length


def _workspace(num_bytes: int, device: torch.device) -> torch.Tensor:
    """The split path's scratch: uninitialised (its kernels write what they read)."""
    return torch.empty(num_bytes, dtype=torch.uint8, device=device)


@GDN_EXTEND.kernel("cuda")
def gdn_extend(
    q,
    k,
    v,
    a,
    b,
    A_log,
    dt_bias,
    state_pool,
    cache_indices,
    cu_seqlens,
    g,
    beta,
    scale,
    use_qk_l2norm,
    out,
):
    """one CTA per (sequence, value head, 32 state rows) walks the sequence's chunks
    in order, its state slice in registers (read from the pool once, written once);
    for long sequences (:func:`use_split_path`) after a parallel pass over every chunk's
    state-free work. mma.sync on sm_80 and newer. Deterministic: no atomics on the state.

    >>> H, HV, K, V = 16, 32, 128, 128
    >>> cu_seqlens = torch.tensor([0, 100, 100, 350], device="cuda")  # 3 sequences
    >>> x = lambda *shape: torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    >>> pool = torch.zeros(8, HV, V, K, device="cuda")
    >>> A_log, dt_bias = torch.zeros(HV, device="cuda"), torch.zeros(HV, device="cuda")
    >>> idx = torch.tensor([3, 0, -1], device="cuda")
    >>> o = gdn_extend(x(350, H, K), x(350, H, K), x(350, HV, V), x(350, HV), x(350, HV),
    ...                A_log, dt_bias, pool, idx, cu_seqlens)
    >>> o.shape
    torch.Size([350, 32, 128])
    """
    out = torch.empty_like(v) if out is None else out
    # [0]: indices past the pool, [1]: sequences outside the tokens
    errors = torch.zeros(2, dtype=torch.int32, device=q.device) if env.check_bounds() else None
    index = q.get_device()
    module = _GDN_EXTEND[index]
    args = (out, q, k, v, a, b, A_log, dt_bias, g, beta, state_pool, cache_indices, cu_seqlens)
    # The rule reads sizes the kernel has not checked yet: other ranks take the fused
    # path, whose checks name the argument.
    shaped = q.dim() == 3 and v.dim() == 3 and cu_seqlens.dim() == 1
    tokens, sequences = (q.shape[0], cu_seqlens.shape[0] - 1) if shaped else (0, 0)
    fp16 = q.dtype == torch.float16
    if _force_path is not None:
        split = _force_path in ("split", "segments")
    else:
        split = shaped and use_split_path(
            tokens, sequences, v.shape[1], q.shape[2], v.shape[2], device_facts(index).sm_count
        )
        # Where the walk's shared memory exceeds the GPU's (float16 on sm_86 / sm_89), the
        # fused kernel runs instead: slower for long sequences, never refused.
        split = split and module.gdn_extend_split_fits(index, q.shape[2], fp16)
    if split:
        if _force_path is not None:
            segments = _FORCED_SEGMENT_CHUNKS if _force_path == "segments" else 0
        else:
            sms = device_facts(index).sm_count
            segments = segment_chunks(tokens, sequences, v.shape[1], q.shape[2], v.shape[2], sms)
        size = module.gdn_extend_workspace_bytes(
            tokens, sequences, q.shape[1], v.shape[1], q.shape[2], v.shape[2], fp16, segments
        )  # fmt: skip
        workspace = _workspace(size, q.device)
        module.gdn_extend_split(*args, scale, use_qk_l2norm, errors, workspace, segments)
    else:
        module.gdn_extend(*args, scale, use_qk_l2norm, errors)
    if errors is not None:
        raise_if_counted(
            errors[0],
            "gdn_extend: {count} of argument 'cache_indices' are >= the pool's "
            f"{state_pool.shape[0]} states; their outputs are NaN and the pool was not touched",
        )
        raise_if_counted(
            errors[1],
            "gdn_extend: {count} sequences of argument 'cu_seqlens' are not within the "
            f"{q.shape[0]} tokens (0 <= cu_seqlens[n] <= cu_seqlens[n + 1] <= total_tokens); "
            "they were skipped",
        )
    return out
