"""Dense GEMM for Hopper: ``a @ b.T`` (+ bias), TMA + wgmma, fp32 accumulation.

One kernel source (``csrc/gemm.cu``) compiled per tile configuration; which one runs
is decided per problem shape by :func:`choose_tile`, the one place that knows the
heuristic. Every configuration is registered under the kernel name ``gemm``, so
``python -m mllm_kernel precompile --device cuda --arch 9.0a --kernel gemm`` builds
them all ahead of time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import torch

from mllm_kernel.cuda.device_facts import device_facts, require_hopper
from mllm_kernel.jit_utils import op_inputs
from mllm_kernel.jit_utils.cuda_arch import HOPPER_ONLY
from mllm_kernel.jit_utils.cuda_driver import require_torch_cuda
from mllm_kernel.jit_utils.kernel_module import KernelModule
from mllm_kernel.jit_utils.torch_op import refuse_grad, torch_op

_tracing = torch.compiler.is_dynamo_compiling

_DTYPES = (torch.bfloat16, torch.float16)
_H100_SMS = 132


@dataclass(frozen=True)
class TileConfig:
    """A compiled kernel shape (the template arguments of ``csrc/gemm.cu``).

    ``consumers`` warpgroups each multiply 64 rows of the P operand by ``tile_q`` rows
    of the Q operand (wgmma m64 x n``tile_q``) through ``stages`` shared-memory
    stages. Without ``swap_ab`` P is ``a`` and Q is ``b``: an output tile is
    ``64 * consumers`` x ``tile_q``. With it P is ``b`` (weights) and Q is ``a``
    (tokens): an output tile is ``tile_q`` tokens x ``64 * consumers`` columns, and up
    to ``max_split`` CTAs of a cluster share its K (shared memory bounds the split).
    ``multicast`` CTAs of a cluster on neighbouring tile-rows share each Q tile, each
    loading a slice of it for all (TMA multicast): less L2 traffic per flop.
    """

    name: str
    swap_ab: bool
    consumers: int
    tile_q: int
    stages: int
    max_split: int = 1
    multicast: int = 1

    @property
    def tile_m(self) -> int:
        """Output rows per tile."""
        return self.tile_q if self.swap_ab else 64 * self.consumers

    @property
    def tile_n(self) -> int:
        """Output columns per tile."""
        return 64 * self.consumers if self.swap_ab else self.tile_q

    @property
    def shape_args(self) -> tuple[int, int, int, bool, int]:
        """The template arguments after the element type (``int8_scaled_mm`` has none)."""
        return (self.consumers, self.tile_q, self.stages, self.swap_ab, self.multicast)

    def template_args(self, dtype: torch.dtype) -> tuple[Any, ...]:
        return (dtype, *self.shape_args)


TILES = (
    # Multicast over clusters of 2 measured +5% (128 x 256) and +12% (128 x 128) at
    # 8192^3 on an H100 against the same tiles without it (benchmarks/RESULTS.md).
    TileConfig("128x256-mc2", swap_ab=False, consumers=2, tile_q=256, stages=4, multicast=2),
    TileConfig("128x128-mc2", swap_ab=False, consumers=2, tile_q=128, stages=6, multicast=2),
    TileConfig("swap-16x64", swap_ab=True, consumers=1, tile_q=16, stages=8, max_split=8),
    TileConfig("swap-32x64", swap_ab=True, consumers=1, tile_q=32, stages=8, max_split=8),
    TileConfig("swap-64x64", swap_ab=True, consumers=1, tile_q=64, stages=6, max_split=4),
    TileConfig("swap-128x64", swap_ab=True, consumers=1, tile_q=128, stages=6, max_split=2),
)
_BY_NAME = {tile.name: tile for tile in TILES}


@dataclass(frozen=True)
class TileChoice:
    """The configuration a problem shape runs with, its split of K, and how many
    tile-rows the persistent walk takes at a time (tiles running together then
    share those rows of A and the columns of B in L2)."""

    tile: TileConfig
    split: int = 1
    group_rows: int = 8

    def __str__(self) -> str:
        return self.tile.name + (f", split-K {self.split}" if self.split > 1 else "")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def choose_tile(
    m: int, n: int, k: int, num_sms: int = _H100_SMS, element_bytes: int = 2
) -> TileChoice:
    """The tile configuration for an ``m x n x k`` problem on ``num_sms`` SMs, with
    operands of ``element_bytes`` (2: bf16/fp16; 1: int8, whose k-blocks of 128 bytes
    hold 128 elements).

    - ``m <= 128`` (decode and small batches) reads far more weight bytes than it
      does arithmetic: the swapped kernels put 64 weight rows on wgmma's fixed
      64-row side and the ``m`` tokens, rounded up to 16/32/64/128, on its narrow
      side. K is split over a cluster while there is at most one CTA per SM, keeping
      at least 8 k-blocks (1 KB of each row) per CTA: on an H100 more and shorter CTAs lost
      bandwidth to pipeline fill and the reduction (M = 1, N = K = 4096: 74% of a
      copy with splits 1 and 2, 57% with 4, 49% with 8; N = 4096, K = 14336: 86, 92,
      80 and 78%). int8 k-blocks go by twice as fast (k32 wgmma at twice the rate),
      and a split needs 32 of them (4 KB of each row) per CTA to pay: H100, N = 4096,
      M = 1 / 16 / 64, K = 4096: 9.8 / 9.9 / 12.5 us unsplit, 10.8 / 10.7 / 13.1 us
      with split 2; K = 14336: 25.4 / 26.1 / 31.4 us unsplit, 24.6 / 25.2 / 28.6 us
      with split 2, 30.1 / 30.4 / 44.5 us with 4 (bench_int8_gemm.py --sweep).
    - Larger ``m``: 128 x 256 tiles, the widest wgmma and the fewest bytes per flop,
      unless 128 x 128 tiles fill the SMs' last wave clearly better (small grids);
      both in clusters of 2 CTAs on neighbouring tile-rows that multicast B.
    """
    if m <= 128:
        tile = next(t for t in TILES if t.swap_ab and t.tile_q >= m)
        tiles = _ceil_div(n, tile.tile_n) * _ceil_div(m, tile.tile_m)
        k_blocks = _ceil_div(k * element_bytes, 128)
        min_blocks = 8 if element_bytes == 2 else 32
        split = 1
        while (
            split * 2 <= tile.max_split
            and tiles * split * 2 <= num_sms
            and k_blocks // (split * 2) >= min_blocks
        ):
            split *= 2
        return TileChoice(tile, split)

    def wave_efficiency(tile: TileConfig) -> float:
        # Clusters of `multicast` CTAs walk the tiles; the last round may run part-full.
        units = _ceil_div(_ceil_div(m, tile.tile_m), tile.multicast) * _ceil_div(n, tile.tile_n)
        slots = num_sms // tile.multicast
        return units / (_ceil_div(units, slots) * slots)

    # 128 x 128 tiles ran 1-22% slower than 128 x 256 where both filled their rounds
    # (H100; 4096^3 and 8192^3), and 14% faster at M = 1024, N = 14336, K = 4096, where
    # 128 x 256 leaves a 40%-empty last round (wave efficiency 0.85 against 0.97).
    wide, narrow = _BY_NAME["128x256-mc2"], _BY_NAME["128x128-mc2"]
    if wave_efficiency(narrow) > 1.1 * wave_efficiency(wide):
        return TileChoice(narrow)
    return TileChoice(wide)


_GEMM = KernelModule(
    "gemm",
    device="cuda",
    sources=["gemm.cu"],
    exports=["gemm"],
    variants=[tile.template_args(dtype) for dtype in _DTYPES for tile in TILES],
    archs=HOPPER_ONLY,
)


_choices: dict[tuple[int, int, int, int], TileChoice] = {}
_lock = threading.Lock()


def _choice(m: int, n: int, k: int, index: int) -> TileChoice:
    key = (m, n, k, index)
    choice = _choices.get(key)
    if choice is None:
        choice = choose_tile(m, n, k, require_hopper(index, "gemm").sm_count)
        with _lock:
            _choices[key] = choice
    return choice


def _operands_device(a: torch.Tensor, b: torch.Tensor) -> int:
    """The GPU index of ``a`` once both operands are 2-D and ``a`` has a GEMM dtype
    (the C++ side checks the rest); ValueError, via op_inputs, for a tensor not on a GPU."""
    for arg, value in (("a", a), ("b", b)):
        if value.dim() != 2:
            raise ValueError(
                f"argument '{arg}': expected a 2-D tensor ([M, K] for a, [N, K] for b) but got "
                f"shape {list(value.shape)}"
            )
    if a.dtype not in _DTYPES:  # checked before a module is chosen (one per dtype)
        raise TypeError(f"argument 'a': expected dtype bfloat16 or float16 but got {a.dtype}")
    index = a.get_device()
    if index < 0:
        op_inputs.check_device("cuda", a=a)
    return index


def _output(
    a: torch.Tensor, n: int, out: torch.Tensor | None, out_dtype: torch.dtype | None
) -> torch.Tensor:
    """``out``, or a new ``[M, N]`` tensor, in the requested output dtype."""
    if out_dtype is None:
        out_dtype = a.dtype
    elif out_dtype not in (a.dtype, torch.float32):
        raise ValueError(
            f"argument 'out_dtype': expected the input dtype ({a.dtype}) or torch.float32, "
            f"got {out_dtype}"
        )
    if out is None:
        return torch.empty((a.shape[0], n), dtype=out_dtype, device=a.device)
    out = op_inputs.output(out, "out")
    if out.dtype != out_dtype:
        raise TypeError(f"argument 'out': expected dtype {out_dtype} but got {out.dtype}")
    return out


def _launch(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    choice: TileChoice,
) -> torch.Tensor:
    module = _GEMM[(a.get_device(), *choice.tile.template_args(a.dtype))]
    module.gemm(out, a, b, bias, choice.split, choice.group_rows)
    return out


def gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor | None = None,
    *,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``a @ b.T (+ bias)`` on a Hopper GPU (compute capability 9.0).

    ``a`` is ``[M, K]`` and ``b`` ``[N, K]`` (the ``nn.Linear`` weight layout), both
    bf16 or both fp16, with a contiguous last dim; a larger row stride (a slice of a
    bigger buffer) is fine when it is a multiple of 8 elements. ``N`` and ``K`` must
    be multiples of 8 (16-byte rows for TMA); any ``M``. Accumulates in fp32 and
    returns ``[M, N]`` in ``out_dtype`` (the input dtype by default, or
    ``torch.float32``), written into ``out`` if given. ``bias`` (``[N]``, the output
    dtype) is added before the cast. Runs on torch's current stream of ``a``'s GPU.

    Raises TypeError/ValueError naming the argument for bad inputs, and
    NotImplementedError on a GPU other than sm_90.

    >>> a = torch.randn(16, 4096, dtype=torch.bfloat16, device="cuda")
    >>> w = torch.randn(14336, 4096, dtype=torch.bfloat16, device="cuda")
    >>> gemm(a, w).shape
    torch.Size([16, 14336])
    """
    if _tracing():
        return GEMM_OP(a, b, bias=bias, out_dtype=out_dtype, out=out)
    a, b = op_inputs.tensor(a, "a"), op_inputs.tensor(b, "b")
    bias = op_inputs.optional_tensor(bias, "bias")
    refuse_grad("gemm", a, b, bias, out)
    try:
        index = _operands_device(a, b)
        m, k = a.shape
        n = b.shape[0]
        choice = _choices.get((m, n, k, index)) or _choice(m, n, k, index)
        out = _output(a, n, out, out_dtype)
        return _launch(a, b, out, bias, choice)
    except Exception as error:
        op_inputs.explain(error, "cuda", a=a, b=b, out=out, bias=bias)
        raise


def _gemm_op(a, b, bias=None, out_dtype=None, *, out=None) -> torch.Tensor:
    """:func:`gemm` with the op's argument order: torch ops take no keyword-only tensor
    but the output buffer, so ``bias`` is positional there."""
    return gemm(a, b, out, bias=bias, out_dtype=out_dtype)


GEMM_OP = torch_op(
    "gemm",
    "(Tensor a, Tensor b, Tensor? bias=None, ScalarType? out_dtype=None) -> Tensor",
    fake=lambda a, b, bias=None, out_dtype=None: a.new_empty(
        (a.shape[0], b.shape[0]), dtype=out_dtype or a.dtype
    ),
    out="out",
).implement("cuda", _gemm_op)


_DTYPE_NAMES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}
_SM90_NAMES = {"sm90", "sm_90", "sm90a", "sm_90a", "9.0", "9.0a", "90", "90a"}


def _as_dtype(value: str | torch.dtype, arg: str) -> torch.dtype:
    dtype = value if isinstance(value, torch.dtype) else _DTYPE_NAMES.get(str(value).lower())
    if dtype is None:
        raise ValueError(
            f"argument '{arg}': unknown dtype {value!r}; use one of {list(_DTYPE_NAMES)}"
        )
    return dtype


class Gemm:
    """A GEMM of one problem shape, ``[M, K] @ [N, K]^T``, with its tile chosen once.

    For users of the CuTe runtime's object API: build it once per shape, call it
    many times. It runs the same kernel as :func:`gemm`; ``tile_config`` reports the
    configuration :func:`choose_tile` picked for this shape and this GPU.

    NumPy arrays are accepted for ``a`` and ``b``: they are copied to the current
    GPU in ``dtype``, and the result comes back as a NumPy array (float32 for a
    bf16 result, which NumPy cannot hold).

    >>> op = Gemm(16, 14336, 4096)
    >>> op.tile_config  # doctest: +SKIP
    TileChoice(tile=TileConfig(name='swap-16x64', ...), split=1)
    >>> op(a, w).shape  # doctest: +SKIP
    torch.Size([16, 14336])
    """

    def __init__(
        self,
        M: int,
        N: int,
        K: int,
        dtype: str | torch.dtype = "bfloat16",
        out_dtype: str | torch.dtype | None = None,
        arch: str = "sm90",
    ) -> None:
        for arg, value in (("M", M), ("N", N), ("K", K)):
            if type(value) is not int or value < 0:
                raise ValueError(f"argument '{arg}': expected a non-negative int, got {value!r}")
        if N % 8 or K % 8:
            raise ValueError(f"N ({N}) and K ({K}) must be multiples of 8 (16-byte rows for TMA)")
        if str(arch).lower() not in _SM90_NAMES:
            raise NotImplementedError(
                f"Gemm is built for Hopper only (arch='sm90', compute capability 9.0), got {arch!r}"
            )
        self.M, self.N, self.K = M, N, K
        self.dtype = _as_dtype(dtype, "dtype")
        if self.dtype not in _DTYPES:
            raise ValueError(f"argument 'dtype': expected bfloat16 or float16, got {self.dtype}")
        self.out_dtype = self.dtype if out_dtype is None else _as_dtype(out_dtype, "out_dtype")
        if self.out_dtype not in (self.dtype, torch.float32):
            raise ValueError(
                f"argument 'out_dtype': expected {self.dtype} or float32, got {self.out_dtype}"
            )
        facts = device_facts(torch.cuda.current_device()) if torch.cuda.is_available() else None
        hopper = facts is not None and facts.capability == (9, 0)
        self.num_sms = require_hopper(facts.index, "gemm").sm_count if hopper else _H100_SMS
        self.tile_config = choose_tile(M, N, K, self.num_sms)

    @staticmethod
    def choose_tile(M: int, N: int, K: int, num_sms: int = _H100_SMS) -> TileChoice:
        """The configuration an ``M x N x K`` problem runs with (see :func:`choose_tile`)."""
        return choose_tile(M, N, K, num_sms)

    def __call__(
        self,
        a: Any,
        b: Any,
        out: torch.Tensor | None = None,
        *,
        bias: torch.Tensor | None = None,
    ) -> Any:
        from_numpy = not isinstance(a, torch.Tensor)
        a, b = self._on_gpu(a, "a"), self._on_gpu(b, "b")
        for arg, value, shape in (("a", a, (self.M, self.K)), ("b", b, (self.N, self.K))):
            if tuple(value.shape) != shape:
                raise ValueError(
                    f"expected {arg} of shape {list(shape)} (this Gemm's M, N, K) but got "
                    f"{list(value.shape)}"
                )
        bias = op_inputs.optional_tensor(bias, "bias")
        try:
            require_hopper(_operands_device(a, b), "gemm")
            out = _output(a, self.N, out, self.out_dtype)
            result = _launch(a, b, out, bias, self.tile_config)
        except Exception as error:
            op_inputs.explain(error, "cuda", a=a, b=b, out=out, bias=bias)
            raise
        if not from_numpy:
            return result
        if result.dtype == torch.bfloat16:
            result = result.float()
        return result.cpu().numpy()

    def _on_gpu(self, value: Any, arg: str) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return op_inputs.tensor(value, arg)
        import numpy as np

        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"argument '{arg}': expected a torch.Tensor or numpy.ndarray, got "
                f"{type(value).__name__}"
            )
        require_torch_cuda("Gemm with NumPy arrays (copied to the GPU)")
        return torch.from_numpy(np.ascontiguousarray(value)).to("cuda", self.dtype)

    def __repr__(self) -> str:
        return (
            f"Gemm(M={self.M}, N={self.N}, K={self.K}, dtype={self.dtype}, "
            f"out_dtype={self.out_dtype}, tile={self.tile_config})"
        )
