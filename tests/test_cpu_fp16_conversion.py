"""Host conversions between float32 and fp16 / bf16, bit for bit against torch.

Through a test kernel (tests/csrc/float_conversion.cpp) for utils.hpp's element-wise
to_float / from_float and cpu/float_blocks.hpp's widen / narrow, and through the real
CPU ops, which convert by blocks or element by element depending on the build.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mllm_kernel.cpu.jit import add_constant_runtime
from mllm_kernel.jit_utils import cache_once, load_cpu_jit

SOURCE = Path(__file__).parent / "csrc" / "float_conversion.cpp"
EXPORTS = [
    "widen_elementwise",
    "narrow_elementwise",
    "widen_blocks",
    "narrow_blocks",
    "fp16_converts_in_blocks",
]
WIDEN = ["widen_elementwise", "widen_blocks"]
NARROW = ["narrow_elementwise", "narrow_blocks"]


@cache_once
def _module():
    return load_cpu_jit(
        "float_conversion",
        cpp_files=[str(SOURCE)],
        cpp_wrappers=[(name, f"conversion_kernels::{name}") for name in EXPORTS],
    )


@pytest.fixture(scope="module")
def mod():
    return _module()


def _every_pattern(dtype: torch.dtype) -> torch.Tensor:
    """The 65536 values of a 16-bit float dtype, NaNs and infinities included."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)


def _widen(mod, export: str, x: torch.Tensor) -> torch.Tensor:
    out = torch.full(x.shape, float("nan"))
    getattr(mod, export)(out, x)
    return out


def _narrow(mod, export: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=dtype)
    getattr(mod, export)(out, x)
    return out


def _fp16_value(bits: torch.Tensor) -> torch.Tensor:
    """The exact value of each fp16 bit pattern, from its fields in float64 (NaN for NaNs)."""
    bits = bits.to(torch.int64) & 0xFFFF
    sign = torch.where(bits >> 15 == 1, -1.0, 1.0).double()
    exp = (bits >> 10) & 0x1F
    mant = (bits & 0x3FF).double()
    normal = torch.ldexp(1.0 + mant / 1024, (exp - 15).double())
    value = torch.where(exp == 0, mant * 2.0**-24, normal)
    value = torch.where(exp == 31, torch.where(mant == 0, torch.inf, torch.nan), value)
    return sign * value


def _assert_same_bits(ours: torch.Tensor, ref: torch.Tensor) -> None:
    """Equal bit patterns, except that a NaN need only meet a NaN (torch's own
    conversions disagree on NaN signs and payloads: bf16 makes every NaN 0xFFFF)."""
    ours, ref = ours.flatten(), ref.flatten()
    int_type = torch.int32 if ours.element_size() == 4 else torch.int16
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(ours), nan)
    mismatch = (ours.view(int_type) != ref.view(int_type)) & ~nan
    where = mismatch.nonzero().flatten()[:5].tolist()
    assert not where, [(i, ours[i].item(), ref[i].item()) for i in where]


def _floats_to_round() -> torch.Tensor:
    """Float32 values that exercise fp16 rounding, overflow, underflow and NaN."""
    gen = torch.Generator().manual_seed(30)
    random_bits = torch.randint(-(2**31), 2**31, (1 << 20,), generator=gen).to(torch.int32)
    # Every exponent from the fp16 underflow to past its overflow, random mantissas.
    spread = torch.randn(1 << 20, generator=gen) * torch.exp2(
        torch.randint(-30, 18, (1 << 20,), generator=gen).float()
    )
    # Each finite fp16 value, and the float halfway to the next (the ties).
    halves = _every_pattern(torch.float16)
    halves = halves[torch.isfinite(halves)].float()
    ties = (halves.view(torch.int32) + (1 << 12)).view(torch.float32)
    return torch.cat([random_bits.view(torch.float32), spread, halves, ties])


@pytest.mark.parametrize("export", WIDEN)
def test_every_fp16_widens_exactly(mod, export):
    x = _every_pattern(torch.float16)
    ours = _widen(mod, export, x)
    _assert_same_bits(ours, x.float())
    exact = _fp16_value(x.view(torch.int16))
    finite = ~torch.isnan(exact)
    assert torch.equal(ours[finite].double(), exact[finite])


@pytest.mark.parametrize("export", WIDEN)
def test_every_bf16_widens_exactly(mod, export):
    x = _every_pattern(torch.bfloat16)
    _assert_same_bits(_widen(mod, export, x), x.float())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("export", NARROW)
def test_narrowing_rounds_like_torch(mod, export, dtype):
    x = _floats_to_round()
    _assert_same_bits(_narrow(mod, export, x, dtype), x.to(dtype))


@pytest.mark.parametrize("export", NARROW)
def test_fp16_narrowing_edge_cases(mod, export):
    cases = [  # (float32 value, fp16 bits), round to nearest even
        (0.0, 0x0000),
        (-0.0, 0x8000),
        (1.0 + 2.0**-11, 0x3C00),  # tie, to the even 1.0
        (1.0 + 3 * 2.0**-11, 0x3C02),  # tie, to the even 1 + 2^-9
        (1.0 + 2.0**-11 + 2.0**-23, 0x3C01),  # just past the tie
        (65504.0, 0x7BFF),  # the largest fp16
        (65519.99609375, 0x7BFF),  # the largest float below the overflow tie
        (65520.0, 0x7C00),  # the tie at the top rounds to inf
        (-65520.0, 0xFC00),
        (2.0**16, 0x7C00),
        (3.0e38, 0x7C00),
        (float("inf"), 0x7C00),
        (float("-inf"), 0xFC00),
        (2.0**-24, 0x0001),  # the smallest subnormal
        (-(2.0**-24), 0x8001),
        (2.0**-25, 0x0000),  # tie between 0 and 2^-24: to the even 0
        (2.0**-25 + 2.0**-48, 0x0001),
        (3 * 2.0**-25, 0x0002),  # tie between 2^-24 and 2^-23: to the even 2^-23
        (2.0**-14 - 2.0**-25, 0x0400),  # tie below the smallest normal: up to it
        (2.0**-14, 0x0400),
        (1e-45, 0x0000),  # a float32 subnormal
    ]
    x = torch.tensor([value for value, _ in cases], dtype=torch.float32)
    ours = _narrow(mod, export, x, torch.float16).view(torch.int16).int() & 0xFFFF
    assert ours.tolist() == [bits for _, bits in cases]
    nan = _narrow(mod, export, torch.tensor([float("nan"), -float("nan")]), torch.float16)
    assert torch.isnan(nan).all() and torch.signbit(nan).tolist() == [False, True]


def test_fp16_converts_in_blocks_where_the_cpu_has_f16c(mod):
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    has_f16c = " f16c" in flags
    assert mod.fp16_converts_in_blocks() == has_f16c


def _strided_rows(x: torch.Tensor) -> torch.Tensor:
    """x as 256 rows of 256 that lie 512 apart (ops convert those element by element)."""
    base = torch.zeros(256, 512, dtype=x.dtype)
    base[:, :256] = x.view(256, 256)
    return base[:, :256]


@pytest.mark.parametrize(
    "view",
    [
        lambda x: x,  # one dense run: whole blocks, split over threads
        lambda x: torch.cat([x, x[:5]]),  # blocks and a remainder
        _strided_rows,
    ],
    ids=["dense", "remainder", "strided"],
)
def test_fp16_op_keeps_every_value(view):
    # x + 0 is x for every fp16 value (-0 + 0 = +0, as in torch), so the op's
    # widening and narrowing must both be exact for all 65536 patterns.
    x = view(_every_pattern(torch.float16))
    _assert_same_bits(add_constant_runtime(x, 0.0), torch.add(x, 0.0))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_op_rounds_like_torch(dtype):
    # Float32 sums that fall between representable values, rounded as torch rounds them.
    # Each constant is one of the dtype's values: torch rounds the scalar to the dtype
    # before adding, the kernel adds it as a float32.
    x = _every_pattern(dtype)
    for value in (1 / 3, -1e-3, 2.0**-20, 60000.0):
        c = torch.tensor(value, dtype=dtype).item()
        _assert_same_bits(add_constant_runtime(x, c), torch.add(x, c))
