"""Benchmarks of the CUDA ops against the memory-bandwidth roofline, torch eager and
torch.compile, at decode (1 and 8 tokens) and prefill (8192 tokens) sizes.

    python benchmarks/bench_cuda.py [--out benchmarks/RESULTS.md] [--ops rmsnorm,softmax]

For every case, from one run: median time per call; achieved GB/s counting each byte
read and written once; that as a fraction of a device-to-device copy measured in the
same run (the roofline); the speedup over torch eager and over torch.compile of the
same computation ("n/a" where one fails). Prefill inputs rotate among enough buffer
sets to exceed the L2 cache several times, so they come from HBM. Decode cases are
launch-bound: each is timed interleaved with an empty kernel launched through
tvm-ffi, their floor.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import mllm_kernel.cuda.jit as ops  # noqa: E402
from mllm_kernel.jit_utils import load_cuda_jit  # noqa: E402

DECODE_TOKENS = (1, 8)
PREFILL_TOKENS = 8192
HIDDEN = 4096
INTERMEDIATE = 14336
BF16 = torch.bfloat16


# --- timing ---------------------------------------------------------------------------


def _sample(calls: list[Callable[[], object]], inner: int) -> float:
    """Seconds per call of ``inner`` calls rotating over ``calls``, by CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(inner):
        calls[i % len(calls)]()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / inner


def time_interleaved(
    contenders: dict[str, list[Callable[[], object]]], inner: int = 20, outer: int = 15
) -> dict[str, float]:
    """Median seconds per call of each contender. The samples are taken in turn, one
    contender after another, in an order rotated every round: the shared machine's load
    drifts (decode times moved by up to 50% between runs), and interleaving makes the
    drift fall on all contenders alike, so their ratios hold when absolute times do not."""
    for calls in contenders.values():
        for call in calls:
            call()
    torch.cuda.synchronize()
    names = list(contenders)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(outer):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_sample(contenders[name], inner))
    return {name: statistics.median(values) for name, values in samples.items()}


def time_calls(calls: list[Callable[[], object]], inner: int = 20, outer: int = 15) -> float:
    """Median seconds per call; each sample runs ``inner`` calls rotating over ``calls``."""
    return time_interleaved({"calls": calls}, inner, outer)["calls"]


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 * 2**20))


def copy_bandwidth(total_bytes: int = 2**31) -> float:
    """GB/s of a device-to-device torch copy_ moving ``total_bytes`` (half read, half
    written), rotating over enough buffers that L2 holds none of them."""
    n = total_bytes // 2
    sets = max(1, math.ceil(3 * l2_bytes() / total_bytes))
    pairs = [
        (
            torch.empty(n, dtype=torch.uint8, device="cuda"),
            torch.empty(n, dtype=torch.uint8, device="cuda"),
        )
        for _ in range(sets)
    ]
    calls = [lambda src=src, dst=dst: dst.copy_(src) for src, dst in pairs]
    seconds = time_calls(calls, inner=max(5, 2 * sets), outer=10)
    return 2 * n / seconds / 1e9


_EMPTY_KERNEL = """\
// A kernel that does nothing: the floor of a launch through tvm-ffi.
#include "mllm_kernel/tensor.hpp"
#include "mllm_kernel/utils.cuh"

namespace bench {
__global__ void empty_kernel() {}
inline void launch_empty(tvm::ffi::TensorView x) {
  mllm_kernel::KernelLauncher(dim3(1), dim3(32), x.device())(empty_kernel);
}
}  // namespace bench
"""


def launch_floor_calls() -> list[Callable[[], object]]:
    """A call launching an empty kernel through tvm-ffi (one tensor argument)."""
    source = Path(tempfile.gettempdir()) / "mllm_kernel_bench" / "empty_kernel.cu"
    source.parent.mkdir(parents=True, exist_ok=True)
    if not source.is_file() or source.read_text() != _EMPTY_KERNEL:
        source.write_text(_EMPTY_KERNEL)
    module = load_cuda_jit(
        "bench_empty_kernel",
        cuda_files=[source],
        cuda_wrappers=[("launch_empty", "bench::launch_empty")],
    )
    x = torch.empty(1, device="cuda")
    return [lambda: module.launch_empty(x)]


def host_costs(floor: list[Callable[[], object]]) -> dict[str, float]:
    """The launch floor and torch's allocation of a decode-sized output, interleaved:
    what an op that returns a new tensor pays on top of its launch."""
    x = torch.empty(1, HIDDEN, device="cuda", dtype=BF16)
    return time_interleaved(
        {"floor": floor, "empty_like": [lambda: torch.empty_like(x)]}, inner=200, outer=15
    )


# --- cases ----------------------------------------------------------------------------


@dataclass
class Case:
    """One op at one size. ``make()`` builds a fresh input set (a dict); ``ours`` and
    ``torch_fn`` take one; ``bytes`` is what one call must read and write. For ops that
    return a new tensor, ``ours_out`` is the same call writing into ``inputs["out"]``
    (made by ``make``): what a decode loop that reuses its buffers pays."""

    op: str
    shape: str
    dtype: torch.dtype
    phase: str
    make: Callable[[], dict]
    ours: Callable[[dict], object]
    torch_fn: Callable[[dict], object]
    bytes: int
    ours_out: Callable[[dict], object] | None = None


def _with_out(inputs: dict, shape, dtype: torch.dtype = BF16) -> dict:
    """``inputs`` plus an output buffer ``out`` of ``shape`` for the ``out=`` form."""
    dtype = inputs["x"].dtype if "x" in inputs else dtype
    return {**inputs, "out": torch.empty(shape, device="cuda", dtype=dtype)}


def _nbytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _rms_torch(x, w, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def _fused_torch(x, r, w):
    r.add_(x)
    x.copy_(_rms_torch(r, w))


def _rope_torch(pos, q, k, cache, head_size=128):
    half = cache.shape[1] // 2
    cos = cache[pos, :half][:, None, :]
    sin = cache[pos, half:][:, None, :]
    for t in (q, k):
        v = t.view(t.shape[0], -1, head_size)
        x1, x2 = v[..., :half].float(), v[..., half:].float()
        v.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(t.dtype))


def _kv_indices_torch(r2t, pool, lens, indptr, start, out):
    j = torch.arange(out.numel(), device=out.device)
    req = torch.searchsorted(indptr.long(), j, right=True) - 1
    out.copy_(r2t[pool[req], start[req] + j - indptr[req]])


def rowwise_cases(tokens: int, phase: str) -> list[Case]:
    t, h, d = tokens, HIDDEN, INTERMEDIATE
    shape = f"{t}x{h}"
    cases = [
        Case(
            "add_constant(c=8)",
            shape,
            BF16,
            phase,
            lambda: _with_out({"x": torch.randn(t, h, device="cuda", dtype=BF16)}, (t, h)),
            lambda i: ops.add_constant(i["x"], 8),
            lambda i: i["x"] + 8,
            2 * t * h * 2,
            lambda i: ops.add_constant(i["x"], 8, out=i["out"]),
        ),
        Case(
            "rmsnorm",
            shape,
            BF16,
            phase,
            lambda: _with_out(
                {
                    "x": torch.randn(t, h, device="cuda", dtype=BF16),
                    "w": torch.randn(h, device="cuda", dtype=BF16),
                },
                (t, h),
            ),
            lambda i: ops.rmsnorm(i["x"], i["w"]),
            lambda i: _rms_torch(i["x"], i["w"]),
            (2 * t * h + h) * 2,
            lambda i: ops.rmsnorm(i["x"], i["w"], out=i["out"]),
        ),
        Case(
            "fused_add_rmsnorm",
            shape,
            BF16,
            phase,
            lambda: {
                "x": torch.randn(t, h, device="cuda", dtype=BF16),
                "r": torch.randn(t, h, device="cuda", dtype=BF16),
                "w": torch.randn(h, device="cuda", dtype=BF16),
            },
            lambda i: ops.fused_add_rmsnorm(i["x"], i["r"], i["w"]),
            lambda i: _fused_torch(i["x"], i["r"], i["w"]),
            (4 * t * h + h) * 2,
        ),
        Case(
            "rms_norm_gated",
            shape,
            BF16,
            phase,
            lambda: _with_out(
                {
                    "x": torch.randn(t, h, device="cuda", dtype=BF16),
                    "z": torch.randn(t, h, device="cuda", dtype=BF16),
                    "w": torch.randn(h, device="cuda", dtype=BF16),
                },
                (t, h),
            ),
            lambda i: ops.rms_norm_gated(i["x"], i["w"], i["z"]),
            lambda i: _rms_torch(i["x"], i["w"]) * torch.nn.functional.silu(i["z"]),
            (3 * t * h + h) * 2,
            lambda i: ops.rms_norm_gated(i["x"], i["w"], i["z"], out=i["out"]),
        ),
    ]
    activations = {
        "silu_and_mul": lambda x: torch.nn.functional.silu(x),
        "gelu_and_mul": lambda x: torch.nn.functional.gelu(x),
        "gelu_tanh_and_mul": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    }
    for name, act in activations.items():
        cases.append(
            Case(
                name,
                f"{t}x{2 * d}",
                BF16,
                phase,
                lambda: _with_out({"x": torch.randn(t, 2 * d, device="cuda", dtype=BF16)}, (t, d)),
                lambda i, name=name: getattr(ops, name)(i["x"]),
                lambda i, act=act: act(i["x"][:, :d]) * i["x"][:, d:],
                3 * t * d * 2,
                lambda i, name=name: getattr(ops, name)(i["x"], out=i["out"]),
            )
        )

    def rope_inputs():
        inv = 1.0 / (10000 ** (torch.arange(0, 128, 2, device="cuda") / 128))
        freqs = torch.outer(torch.arange(8192, device="cuda").float(), inv)
        return {
            "pos": torch.randint(0, 8192, (t,), device="cuda"),
            "q": torch.randn(t, 32 * 128, device="cuda", dtype=BF16),
            "k": torch.randn(t, 8 * 128, device="cuda", dtype=BF16),
            "cache": torch.cat([freqs.cos(), freqs.sin()], -1),
        }

    cases.append(
        Case(
            "rope (neox, 32q+8k heads x 128)",
            f"{t}x{40 * 128}",
            BF16,
            phase,
            rope_inputs,
            lambda i: ops.apply_rope_with_cos_sin_cache_inplace(
                i["pos"], i["q"], i["k"], 128, i["cache"]
            ),
            lambda i: _rope_torch(i["pos"], i["q"], i["k"], i["cache"]),
            2 * t * 40 * 128 * 2 + t * 128 * 4 + t * 8,
        )
    )

    slots = max(4 * t, 65536)
    for heads in (8, 32):  # a GQA model's KV, and an MHA one's (hidden 4096)

        def kv_inputs(heads=heads):
            return {
                "k": torch.randn(t, heads, 128, device="cuda", dtype=BF16),
                "v": torch.randn(t, heads, 128, device="cuda", dtype=BF16),
                "kc": torch.empty(slots, heads, 128, device="cuda", dtype=BF16),
                "vc": torch.empty(slots, heads, 128, device="cuda", dtype=BF16),
                "idx": torch.randperm(slots, device="cuda")[:t],
            }

        def kv_torch(i):
            i["kc"][i["idx"]] = i["k"]
            i["vc"][i["idx"]] = i["v"]

        cases.append(
            Case(
                f"store_cache ({heads} kv heads x 128)",
                f"{t} tokens",
                BF16,
                phase,
                kv_inputs,
                lambda i: ops.store_cache(i["k"], i["v"], i["kc"], i["vc"], i["idx"]),
                kv_torch,
                4 * t * heads * 128 * 2 + t * 8,
            )
        )

    batch, context = (t, 4096) if phase == "decode" else (64, PREFILL_TOKENS)

    def kv_indices_inputs():
        lens = torch.full((batch,), context, device="cuda", dtype=torch.int32)
        indptr = torch.zeros(batch + 1, device="cuda", dtype=torch.int32)
        indptr[1:] = torch.cumsum(lens, 0)
        return {
            "r2t": torch.randint(0, 1 << 20, (256, context + 64), device="cuda", dtype=torch.int32),
            "pool": torch.randperm(256, device="cuda")[:batch],
            "lens": lens,
            "indptr": indptr,
            "start": torch.full((batch,), 64, device="cuda", dtype=torch.int32),
            "out": torch.empty(batch * context, device="cuda", dtype=torch.int32),
        }

    cases.append(
        Case(
            "create_kv_indices",
            f"{batch} req x {context}",
            torch.int32,
            phase,
            kv_indices_inputs,
            lambda i: ops.create_kv_indices(
                i["r2t"], i["pool"], i["lens"], i["indptr"], i["start"], i["out"]
            ),
            lambda i: _kv_indices_torch(
                i["r2t"], i["pool"], i["lens"], i["indptr"], i["start"], i["out"]
            ),
            2 * batch * context * 4,
        )
    )
    return cases


def softmax_cases() -> list[Case]:
    cases = []
    dtype = torch.float32
    for hidden in (1024, 4096, 16384, 32768, 65536, 131072):
        for phase, rows in (("decode", 8), ("prefill", max(8, PREFILL_TOKENS * HIDDEN // hidden))):

            def make(rows=rows, hidden=hidden):
                x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
                return _with_out({"x": x}, x.shape)

            cases.append(
                Case(
                    "softmax (t=0.7)",
                    f"{rows}x{hidden}",
                    dtype,
                    phase,
                    make,
                    lambda i: ops.softmax(i["x"], temperature=0.7),
                    lambda i: torch.softmax(i["x"] / 0.7, -1),
                    2 * rows * hidden * 4,
                    lambda i: ops.softmax(i["x"], temperature=0.7, out=i["out"]),
                )
            )
    for hidden in (4096, 16384, 65536, 131072):
        rows = PREFILL_TOKENS * HIDDEN // hidden

        def make_bwd(rows=rows, hidden=hidden):
            return {
                "g": torch.randn(rows, hidden, device="cuda", dtype=dtype),
                "y": torch.softmax(torch.randn(rows, hidden, device="cuda", dtype=dtype), -1),
            }

        cases.append(
            Case(
                "softmax_backward",
                f"{rows}x{hidden}",
                dtype,
                "prefill",
                make_bwd,
                lambda i: ops.softmax_backward(i["g"], i["y"]),
                lambda i: i["y"] * (i["g"] - (i["g"] * i["y"]).sum(-1, keepdim=True)),
                3 * rows * hidden * 4,
            )
        )
    return cases


# --- running --------------------------------------------------------------------------


def input_sets(case: Case) -> list[dict]:
    """Enough input sets that rotating through them overflows L2 three times (prefill)."""
    first = case.make()
    size = sum(_nbytes(v) for v in first.values() if isinstance(v, torch.Tensor))
    wanted = 1 if case.phase == "decode" else math.ceil(3 * l2_bytes() / max(size, 1))
    return [first] + [case.make() for _ in range(min(max(wanted, 2), 16) - 1)]


def _compiled(fn: Callable[[dict], object]) -> Callable[[dict], object]:
    return torch.compile(fn, dynamic=False)


def _runnable(name: str, calls: list[Callable[[], object]]) -> bool:
    """True when the torch reference runs here (one call); else says why, for an n/a."""
    try:
        calls[0]()
        return True
    except Exception as exc:
        reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
        print(f"  {name} failed: {reason}", file=sys.stderr)
        return False


def measure(case: Case, floor: list[Callable[[], object]] | None) -> dict:
    """Times of ours and of torch's forms of ``case``, interleaved (see time_interleaved);
    a decode case is also interleaved with the launch floor, its own baseline."""
    sets = input_sets(case)
    decode = case.phase == "decode"
    contenders = {"ours": [lambda s=s: case.ours(s) for s in sets]}
    if case.ours_out is not None and decode:
        contenders["ours_out"] = [lambda s=s: case.ours_out(s) for s in sets]
    eager = [lambda s=s: case.torch_fn(s) for s in sets]
    if _runnable(f"eager {case.op}", eager):
        contenders["eager"] = eager
    compiled_fn = _compiled(case.torch_fn)
    compiled = [lambda s=s: compiled_fn(s) for s in sets]
    if _runnable(f"torch.compile {case.op}", compiled):
        contenders["compiled"] = compiled
    if decode and floor is not None:
        contenders["floor"] = floor
    # Decode samples run 200 calls, as host_costs' floor does: a fixed cost per sample
    # (the events, the synchronize) then weighs 10x less on each call than with 20.
    times = time_interleaved(contenders, inner=200 if decode else 20)
    row = {"case": case, **{k: times.get(k) for k in ("ours", "ours_out", "eager", "compiled")}}
    row["floor"] = times.get("floor")
    del sets
    torch.cuda.empty_cache()
    return row


def git_commit() -> str:
    """The commit being measured (short hash), for a table's header."""
    if os.environ.get("GIT_COMMIT"):  # set by scripts/gpu_check.sh where .git did not travel
        return os.environ["GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def render(
    rows: list[dict], copy_gbs: float, host: dict[str, float] | None, same_size: dict[int, float]
) -> str:
    name = torch.cuda.get_device_name()
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    floors = sorted(row["floor"] for row in rows if row["floor"] is not None)
    if host is not None:
        floor_text = (
            f"{host['floor'] * 1e6:.2f} us alone (across the decode rows "
            f"{floors[0] * 1e6:.2f}-{floors[-1] * 1e6:.2f} us)"
            if floors
            else f"{host['floor'] * 1e6:.2f} us"
        )
        alloc = host["empty_like"]
        alloc_text = f"{alloc * 1e6:.2f} us, {alloc / host['floor']:.2f}x the floor"
    else:
        floor_text = alloc_text = "n/a"
    lines = [
        f"# mllm_kernel CUDA benchmarks: {name}",
        "",
        f"- date: {now}; git commit: {git_commit()}; torch {torch.__version__}",
        "- GB/s counts every byte read and written once. '% copy' is that over a",
        "  device-to-device copy_ moving the same bytes, measured in this run: the roofline",
        f"  for that much data; '% 1 GiB copy' is over a copy_ of 1 GiB ({copy_gbs:.0f} GB/s),",
        "  which smaller copies do not reach (launch and tail).",
        "- Each row's contenders (ours, ours with out=, eager, compile and, at decode, the",
        "  launch floor) are sampled in turn, so the machine's changing load falls on all alike.",
        f"- launch floor (an empty kernel through tvm-ffi, one tensor): {floor_text}.",
        "  'x floor' is a decode call's time over the floor sampled with it; '(out=)' the",
        "  same call writing into a preallocated output. Ops that return a new tensor also",
        f"  pay torch's allocation: torch.empty_like of 1x{HIDDEN} bf16 took {alloc_text}.",
        "- 'vs eager' / 'vs compile' are torch's time over ours (> 1: we are faster).",
        "",
        "| op | phase | shape | dtype | time (us) | GB/s | % copy | % 1 GiB copy "
        "| x floor | x floor (out=) | vs eager | vs compile |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        case = row["case"]
        gbs = case.bytes / row["ours"] / 1e9

        def ratio(other, ours=row["ours"]):
            return f"{other / ours:.2f}x" if other is not None else "n/a"

        def same(case=case, gbs=gbs):
            reference = same_size.get(case.bytes)
            return f"{100 * gbs / reference:.0f}%" if reference else "-"

        def over_floor(seconds, floor=row["floor"]):
            return f"{seconds / floor:.2f}x" if floor and seconds is not None else "-"

        dtype = str(case.dtype).removeprefix("torch.")
        lines.append(
            f"| {case.op} | {case.phase} | {case.shape} | {dtype} | {row['ours'] * 1e6:.2f} | "
            f"{gbs:.0f} | {same(case)} | {100 * gbs / copy_gbs:.0f}% | "
            f"{over_floor(row['ours'])} | {over_floor(row['ours_out'])} | "
            f"{ratio(row['eager'])} | {ratio(row['compiled'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "RESULTS.md")
    parser.add_argument("--ops", default="", help="comma-separated substrings of op names")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    copy_gbs = copy_bandwidth()
    try:
        floor = launch_floor_calls()
        host = host_costs(floor)
    except Exception:  # no empty kernel (no compiler?): the table still has the rest
        traceback.print_exc()
        floor = host = None
    cases = [c for tokens in DECODE_TOKENS for c in rowwise_cases(tokens, "decode")]
    cases += rowwise_cases(PREFILL_TOKENS, "prefill") + softmax_cases()
    wanted = [w for w in args.ops.split(",") if w]
    cases = [c for c in cases if not wanted or any(w in c.op for w in wanted)]
    rows = []
    for case in cases:
        print(f"{case.op} {case.phase} {case.shape} ...", file=sys.stderr, flush=True)
        try:
            rows.append(measure(case, floor))
        except Exception:
            traceback.print_exc()
    same_size = {
        row["case"].bytes: copy_bandwidth(row["case"].bytes)
        for row in rows
        if row["case"].phase == "prefill"
    }
    table = render(rows, copy_gbs, host, same_size)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
