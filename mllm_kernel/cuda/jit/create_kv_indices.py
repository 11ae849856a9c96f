"""create_kv_indices: flatten ``req_to_token`` rows into FlashInfer's ``kv_indices`` layout
(the original mllm-kernel's module path ``mllm_kernel.cuda.jit.create_kv_indices``)."""

from __future__ import annotations

import torch

from mllm_kernel.cuda.jit.bounds_check import error_counter, raise_if_counted
from mllm_kernel.jit_utils import env, op_inputs
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import torch_op

_tracing = torch.compiler.is_dynamo_compiling

_NO_START = (0,)

_CREATE_KV_INDICES = KernelModule(
    "create_kv_indices",
    device="cuda",
    sources=["create_kv_indices.cu"],
    exports=["create_kv_indices"],
)


def create_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Fills ``kv_indices`` in FlashInfer's layout: for request i,
    ``kv_indices[kv_indptr[i] : kv_indptr[i] + page_kernel_lens[i]] =
    req_to_token[req_pool_indices[i], kv_start_idx[i] : kv_start_idx[i] + page_kernel_lens[i]]``.

    ``req_to_token`` int32/int64 ``[pool_size, max_context]`` and ``kv_indices`` (1-D,
    contiguous) share a dtype; the 1-D index inputs may be int32 or int64 and strided;
    ``kv_start_idx`` None (or an empty ``[0]`` tensor, as the original mllm-kernel takes
    it) means 0. A request whose ranges fall outside the tensors
    copies nothing (IndexError afterwards with ``MLLM_KERNEL_CHECK_BOUNDS=1``).

    >>> create_kv_indices(req_to_token, req_pool_indices, seq_lens, kv_indptr, None, kv_indices)
    ... # doctest: +SKIP
    """
    if _tracing():
        return CREATE_KV_INDICES_OP(
            req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices
        )
    req_to_token = op_inputs.tensor(req_to_token, "req_to_token")
    req_pool_indices = op_inputs.tensor(req_pool_indices, "req_pool_indices")
    page_kernel_lens = op_inputs.tensor(page_kernel_lens, "page_kernel_lens")
    kv_indptr = op_inputs.tensor(kv_indptr, "kv_indptr")
    kv_start_idx = op_inputs.optional_tensor(kv_start_idx, "kv_start_idx")
    if kv_start_idx is not None and kv_start_idx.shape == _NO_START:
        kv_start_idx = None  # the original mllm-kernel's "no start offsets"
    kv_indices = op_inputs.output(kv_indices, "kv_indices")
    try:
        module = _CREATE_KV_INDICES[kv_indices.get_device()]
        errors = error_counter(kv_indices) if env.check_bounds() else None
        module.create_kv_indices(
            req_to_token,
            req_pool_indices,
            page_kernel_lens,
            kv_indptr,
            kv_start_idx,
            kv_indices,
            errors,
        )
    except Exception as error:
        op_inputs.explain(
            error,
            "cuda",
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            page_kernel_lens=page_kernel_lens,
            kv_indptr=kv_indptr,
            kv_start_idx=kv_start_idx,
            kv_indices=kv_indices,
        )
        raise
    if errors is not None:
        raise_if_counted(
            errors,
            "create_kv_indices: {count} request(s) index outside 'req_to_token' or "
            "'kv_indices' (argument 'req_pool_indices', 'kv_start_idx', 'page_kernel_lens' "
            "or 'kv_indptr'); nothing was copied for them",
        )


CREATE_KV_INDICES_OP = torch_op(
    "create_kv_indices",
    "(Tensor req_to_token, Tensor req_pool_indices, Tensor page_kernel_lens, Tensor kv_indptr, "
    "Tensor? kv_start_idx, Tensor(a!) kv_indices) -> ()",
).implement("cuda", create_kv_indices)
