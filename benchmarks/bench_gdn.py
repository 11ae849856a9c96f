"""gdn_decode against flash-linear-attention (fla), the original mllm-kernel and the
state-traffic floor: Qwen3-Next's linear-attention heads (H=16, HV=32, K=V=128), one
decode token per sequence, batch 1 to 512. With ``--extend``, gdn_extend instead: packed
prefill / extend sequences (section "extend" below).

    python benchmarks/bench_gdn.py [--batches 1,8,32,128,512] [--bf16-state-batches 128,512]
                                   [--configs 0,1,...] [--out FILE]
                                   [--original _peers/mllm-kernel]
    python benchmarks/bench_gdn.py --extend [--tokens 1024,4096,16384]
                                   [--sequences 1,4,16,64] [--heads 16,32]
                                   [--segments 64,128,...] [--out FILE]

The long cases of issue 33 (full heads, then the TP8 slice H=2, HV=8):

    python benchmarks/bench_gdn.py --extend --tokens 16384,65536 --sequences 1,4
    python benchmarks/bench_gdn.py --extend --tokens 16384,65536 --sequences 1,4 --heads 2,8

The contenders, each on bf16 q, k, v, a, b and fp32 A_log, dt_bias:

* ours: ``gdn_decode(q, k, v, a, b, A_log, dt_bias, pool, indices)``, the pool updated in
  place. As in a serving step, where the engine writes the step's indices just before
  the layer runs, the indices are warm in L2: every call of a graph reads the same index
  tensor, on a view of the pool that moves by ``batch`` states each call (so the states
  still rotate through HBM). 'ours, cold indices' is the same with a tensor of indices
  per call instead, read from HBM. With ``--configs``, also each launch configuration
  named there, forced (``ours cN``: what the kernel's choice picks from).
* fla: ``fused_recurrent_gated_delta_rule`` with the gates fused in its kernel as a
  serving engine calls it (``use_gate_in_kernel``: g = -exp(A_log) softplus(a +
  dt_bias); ``use_beta_sigmoid_in_kernel``: beta = sigmoid(b);
  ``use_qk_l2norm_in_kernel``), ``state_v_first`` (the pool's [V, K] layout). It takes
  no pool indices: its initial state is a contiguous block of the pool's rows (a view,
  no gather) and its final state a new fp32 tensor, so it moves the bytes ours does; the
  scatter back into the pool that a serving engine adds is not counted. A graph's calls
  of it all write their final states to the same memory, freed and reused, which L2
  holds at small batches; 'fla kept' keeps each call's final state instead, so that they
  rotate through HBM as the pool's rows do, and 'fla + wb' copies it into the pool's
  rows (the write-back counted).
* original: the original mllm-kernel's ``gdn_decode``, imported from its source tree
  (``--original``) and built by its own JIT on first use; fp32 pools only; warm indices
  as ours.
* floor: a torch ``copy_`` of the state bytes (read once, written once): the time the
  state traffic takes at this device's copy bandwidth.
* launch: a one-element ``zero_``: the time of a kernel that moves nothing, in the same
  graphs (what batch 1 is measured against).

Every contender runs as a CUDA graph of calls whose pool rows rotate through at least
3x L2 of states, so states come from HBM as in a serving step and host overhead is out
(decode runs in graphs in serving engines); the graphs are sampled in turn, in an order
rotated every round, and the median is kept. A first call of each is checked against
the float64 reference of the tests (the last column: max |error| of its bf16 outputs).

extend (``--extend``): ``total tokens`` packed into ``sequences`` of equal length, the
same heads (or ``--heads H,HV``), bf16 q/k/v/a/b, fp32 A_log, dt_bias and pool. The
contenders:

* ours: ``gdn_extend(q, k, v, a, b, A_log, dt_bias, pool, indices, cu_seqlens)``, on the
  path it chooses; 'fused' and 'split': the same call forced onto each of its two paths
  (the split path's walks in one run each, not in segments); with ``--segments``, 'seg
  N': the split path with its walks cut into segments of N chunks, forced (what
  ``segment_chunks`` picks from).
* fla: ``chunk_gated_delta_rule`` on the same packed tensors (``cu_seqlens``), the gates
  fused as for decode (``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel``,
  ``use_qk_l2norm_in_kernel``), ``state_v_first``, the initial states a view of the
  pool's first rows and the final states a new tensor (no scatter into the pool).
* original: the original mllm-kernel's ``gdn_extend_chunkwise`` (built by its own JIT).
* floor: a ``copy_`` of the bytes every contender must move once (q, k, v, a, b read, o
  written, each state read and written): where a memory-bound kernel would end.
* A, B, C: the kernels of ours where it takes the split path (A: every chunk's
  state-free factors in parallel; B: the walks along each sequence, the segmented walk's
  end and output walks together; C: the segmented walk's combine), from torch.profiler's
  CUDA kernel records of three calls: where the time goes.

Each is timed as eager calls (fla's varlen path reads cu_seqlens on the host, so it cannot
be captured in a CUDA graph), the contenders in turn in an order rotated every round,
the median kept; at these sizes a call takes hundreds of microseconds, so the host's
share is small. The error column compares each one's first output with the float64
reference (tests/gdn_reference.py).
"""

from __future__ import annotations

import argparse
import datetime
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "tests"))

import original_peer  # noqa: E402
from gdn_reference import gdn_extend_reference, gdn_reference  # noqa: E402

from mllm_kernel.cuda.device_facts import device_facts  # noqa: E402
from mllm_kernel.cuda.jit.gdn_decode import _GDN_DECODE, gdn_decode  # noqa: E402
from mllm_kernel.cuda.jit.gdn_extend import gdn_extend  # noqa: E402

EXTEND = sys.modules["mllm_kernel.cuda.jit.gdn_extend"]

H, HV, K, V = 16, 32, 128, 128
BF16 = torch.bfloat16


# --- timing ---------------------------------------------------------------------------


def capture(calls: list[Callable[[], object]]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` in order (each already run once, outside the capture)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    return graph


def time_graphs(graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]], rounds: int = 15):
    """Median seconds per call of each ``name: (graph, calls in it)``, replays sampled in
    turn in an order rotated every round, so that the machine's drift falls on all."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(graphs)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for graph, _ in graphs.values():
        graph.replay()
    torch.cuda.synchronize()
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            graph, calls = graphs[name]
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / calls)
    return {name: statistics.median(values) for name, values in samples.items()}


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 * 2**20))


def copy_bandwidth(total_bytes: int = 2**31) -> float:
    """GB/s of a 1 GiB device-to-device copy_ (read + written), for the header."""
    n = total_bytes // 2
    src, dst = (torch.empty(n, dtype=torch.uint8, device="cuda") for _ in range(2))
    dst.copy_(src)
    seconds = time_graphs({"copy": (capture([lambda: dst.copy_(src)] * 5), 5)})["copy"]
    return total_bytes / seconds / 1e9


# --- the contenders -----------------------------------------------------------------------


def inputs(batch: int, state_dtype: torch.dtype) -> dict:
    """One decode step's tensors; a pool of ``rows`` states that the calls rotate over."""
    state_bytes = HV * V * K * torch.tensor([], dtype=state_dtype).element_size()
    rows = max(2 * batch, math.ceil(3 * l2_bytes() / state_bytes / batch) * batch)

    def randn(*shape, dtype=BF16):
        return torch.randn(shape, device="cuda").to(dtype)

    return {
        "q": randn(batch, H, K),
        "k": randn(batch, H, K),
        "v": randn(batch, HV, V),
        "a": randn(batch, HV) * 0.5,
        "b": randn(batch, HV),
        "A_log": torch.empty(HV, device="cuda").uniform_(0.5, 4).log(),
        "dt_bias": randn(HV, dtype=torch.float32) * 0.5 - 3,
        "state_pool": (randn(rows, HV, V, K, dtype=torch.float32) * 0.3).to(state_dtype),
        "state_bytes": state_bytes,
    }


def blocks(batch: int, rows: int) -> list[tuple[int, torch.Tensor]]:
    """The pool's consecutive blocks of ``batch`` rows, as (first row, indices): each
    call's states (fla's initial_state is the block itself)."""
    return [
        (start, torch.arange(start, start + batch, device="cuda"))
        for start in range(0, rows - batch + 1, batch)
    ]


def fla_call(
    fused_recurrent: Callable, case: dict, first: int, finish: str = ""
) -> Callable[[], object]:
    """fla's decode step on the pool's block of rows from ``first``; its output. Its final
    state goes to a new tensor, which ``finish`` says what becomes of:
    - "" (fla): dropped, so a graph's calls all write it to the same memory, which L2
      holds at small batches (a serving engine's next step reads other states);
    - "kept": kept alive, so that each call of a graph writes its own (as many as the
      graph has calls: rotating through HBM like the pool's rows);
    - "write-back": copied into the pool's rows, as a serving engine needs it there
      (ours updates the pool in place)."""
    state = case["state_pool"][first : first + len(case["q"])]
    kept = []

    def call():
        out, final = fused_recurrent(
            case["q"][:, None], case["k"][:, None], case["v"][:, None],
            g=case["a"][:, None], beta=case["b"][:, None], A_log=case["A_log"],
            dt_bias=case["dt_bias"], initial_state=state, output_final_state=True,
            use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, state_v_first=True,
        )  # fmt: skip
        if finish == "kept":
            kept.append(final)
        elif finish == "write-back":
            state.copy_(final)
        return out[:, 0]

    return call


def forced_call(tensors: dict, indices: torch.Tensor, config: int) -> Callable[[], object]:
    """gdn_decode's kernel with launch configuration ``config`` instead of its choice."""
    t = tensors
    device = t["q"].get_device()
    module, sm_count = _GDN_DECODE[device], device_facts(device).sm_count
    out = torch.empty_like(t["v"])

    def call():
        module.gdn_decode(
            out, t["q"], t["k"], t["v"], t["a"], t["b"], t["A_log"], t["dt_bias"], None, None,
            t["state_pool"], indices, None, None, True, None, sm_count, config,
        )  # fmt: skip
        return out

    return call


def contenders(
    case: dict, fused_recurrent, original, configs: list[int]
) -> dict[str, list[Callable[[], object]]]:
    """Each contender as its calls, one per index set."""
    tensors = {name: value for name, value in case.items() if name != "state_bytes"}
    batch, pool = len(case["q"]), case["state_pool"]
    sets = blocks(batch, len(pool))
    index = torch.arange(batch, device="cuda")
    views = [{**tensors, "state_pool": pool[first : first + batch]} for first, _ in sets]
    found = {"ours": [lambda t=t: gdn_decode(**t, cache_indices=index) for t in views]}
    found["ours, cold indices"] = [
        lambda i=i: gdn_decode(**tensors, cache_indices=i) for _, i in sets
    ]
    for config in configs:
        found[f"ours c{config}"] = [forced_call(t, index, config) for t in views]
    if fused_recurrent is not None:
        for finish in ("", "kept", "write-back"):
            name = f"fla, {finish}" if finish else "fla"
            found[name] = [fla_call(fused_recurrent, case, first, finish) for first, _ in sets]
    if original is not None and pool.dtype == torch.float32:
        found["original"] = [lambda t=t: original(**t, cache_indices=index) for t in views]
    flag = torch.zeros(1, device="cuda")
    found["launch"] = [flag.zero_]
    copy_dst = torch.empty_like(pool)
    found["floor"] = [
        lambda f=first: copy_dst[f : f + batch].copy_(pool[f : f + batch]) for first, _ in sets
    ]
    return found


def errors(found: dict[str, list[Callable[[], object]]], case: dict) -> str:
    """Each kernel's max |error| against the float64 reference (tests/gdn_reference.py) on
    the first block of pool rows, each from the same initial states."""
    pool, batch = case["state_pool"], len(case["q"])
    saved = pool[:batch].clone()
    expected, _, _ = gdn_reference(
        case["q"], case["k"], case["v"], saved, torch.arange(batch, device="cuda"),
        a=case["a"], b=case["b"], A_log=case["A_log"], dt_bias=case["dt_bias"],
    )  # fmt: skip
    found_errors = []
    for name in [name for name in found if name not in ("floor", "launch")]:
        pool[:batch].copy_(saved)
        error = (found[name][0]().double() - expected).abs().max().item()
        found_errors.append(f"{name} {error:.2g}")
    pool[:batch].copy_(saved)
    return ", ".join(found_errors)


def measure(
    batch: int, state_dtype: torch.dtype, fused_recurrent, original, configs: list[int]
) -> dict:
    case = inputs(batch, state_dtype)
    found = contenders(case, fused_recurrent, original, configs)
    check = errors(found, case)
    graphs = {}
    for name, calls in found.items():
        try:
            calls[0]()  # warm (JIT, allocator) before the capture
            torch.cuda.synchronize()
            # at least 20 calls, and every index set: the graph's states exceed L2 3x
            ring = [calls[i % len(calls)] for i in range(max(20, len(calls)))]
            graphs[name] = (capture(ring), len(ring))
        except Exception as error:
            print(f"bench_gdn: {name} at batch {batch}: {error!r}", file=sys.stderr)
    times = time_graphs(graphs)
    state_bytes = batch * case["state_bytes"]
    del case, found, graphs
    torch.cuda.empty_cache()
    return {"batch": batch, "state": state_dtype, "bytes": state_bytes, "check": check, **times}


# --- extend -------------------------------------------------------------------------------


def extend_inputs(total: int, sequences: int, heads: int = H, value_heads: int = HV) -> dict:
    """gdn_extend's arguments: ``total`` tokens in ``sequences`` of equal length, each on
    pool row n (the pool holds exactly the sequences' states)."""

    def randn(*shape, dtype=BF16):
        return torch.randn(shape, device="cuda").to(dtype)

    length = total // sequences
    return {
        "q": randn(total, heads, K),
        "k": randn(total, heads, K),
        "v": randn(total, value_heads, V),
        "a": randn(total, value_heads) * 0.5,
        "b": randn(total, value_heads),
        "A_log": torch.empty(value_heads, device="cuda").uniform_(0.5, 4).log(),
        "dt_bias": randn(value_heads, dtype=torch.float32) * 0.5 - 3,
        "state_pool": randn(sequences, value_heads, V, K, dtype=torch.float32) * 0.3,
        "cache_indices": torch.arange(sequences, device="cuda"),
        "cu_seqlens": torch.arange(0, total + 1, length, device="cuda"),
    }


def extend_contenders(
    case: dict, chunk_rule, original, segments: list[int]
) -> dict[str, Callable[[], object]]:
    """Each contender as one call on ``case`` (the pool updated in place where it takes
    one); the floor copies the bytes they all move."""

    def on_path(path, segment_chunks=None):
        def call():
            EXTEND._force_path = path
            forced = EXTEND._FORCED_SEGMENT_CHUNKS
            if segment_chunks is not None:
                EXTEND._FORCED_SEGMENT_CHUNKS = segment_chunks
            try:
                return gdn_extend(**case)
            finally:
                EXTEND._force_path = None
                EXTEND._FORCED_SEGMENT_CHUNKS = forced

        return call

    found = {"ours": lambda: gdn_extend(**case), "fused": on_path("fused")}
    found["split"] = on_path("split")
    for length in segments:
        found[f"seg {length}"] = on_path("segments", length)
    if chunk_rule is not None:
        initial = case["state_pool"]
        offsets_on_host = case["cu_seqlens"].cpu()  # what a serving engine has at hand

        def fla_call():
            return chunk_rule(
                case["q"][None], case["k"][None], case["v"][None], g=case["a"][None],
                beta=case["b"][None], A_log=case["A_log"], dt_bias=case["dt_bias"],
                initial_state=initial, output_final_state=True, use_qk_l2norm_in_kernel=True,
                use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
                cu_seqlens=case["cu_seqlens"], cu_seqlens_cpu=offsets_on_host,
            )[0][0]  # fmt: skip

        found["fla"] = fla_call
    if original is not None:
        found["original"] = lambda: original(**case)
    moved = sum(case[n].nbytes for n in ("q", "k", "v", "a", "b")) + case["v"].nbytes
    moved += 2 * case["state_pool"].nbytes
    src = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    found["floor"] = lambda: dst.copy_(src)
    return found


def time_eager(calls: dict[str, Callable[[], object]], rounds: int = 5, repeat: int = 2):
    """Median seconds per call of each of ``calls``, ``repeat`` calls a sample, the calls
    sampled in turn in an order rotated every round."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    for round_index in range(rounds):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            start.record()
            for _ in range(repeat):
                calls[name]()
            end.record()
            end.synchronize()
            samples[name].append(start.elapsed_time(end) / 1e3 / repeat)
    return {name: statistics.median(values) for name, values in samples.items()}


def split_kernel_times(call: Callable[[], object], repeat: int = 3) -> dict[str, float]:
    """Seconds per call of the split path's kernels, from the profiler's CUDA kernel
    records of ``repeat`` calls: 'factors' (kernel A, every chunk in parallel), 'walk'
    (kernel B, the state along each sequence: all its launches) and 'combine' (the
    segmented walk's); empty when the profiler gives none."""
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            call()
        torch.cuda.synchronize()
    found: dict[str, float] = {}
    for event in prof.key_averages():
        for kernel, name in (
            ("split_factors", "factors"),
            ("split_walk", "walk"),
            ("split_combine", "combine"),
        ):
            if kernel in event.key:
                found[name] = found.get(name, 0.0) + event.device_time_total / 1e6 / repeat
    return found


def measure_extend(
    total: int, sequences: int, heads: tuple[int, int], chunk_rule, original, segments: list[int]
):
    case = extend_inputs(total, sequences, *heads)
    saved = case["state_pool"].clone()
    expected, _ = gdn_extend_reference(
        case["q"], case["k"], case["v"], saved, case["cache_indices"], case["cu_seqlens"],
        a=case["a"], b=case["b"], A_log=case["A_log"], dt_bias=case["dt_bias"],
    )  # fmt: skip
    found = extend_contenders(case, chunk_rule, original, segments)
    check, times = [], {}
    for name in [n for n in found if n != "floor"]:
        case["state_pool"].copy_(saved)
        try:
            error = (found[name]().double() - expected).abs().max().item()
            check.append(f"{name} {error:.2g}")
        except Exception as error:
            print(f"bench_gdn: {name} at {total}/{sequences}: {error!r}", file=sys.stderr)
            del found[name]
    times = time_eager(found)
    if "ours" in found:
        try:
            times.update(split_kernel_times(found["ours"]))
        except Exception as error:
            print(f"bench_gdn: the split path's kernel times: {error!r}", file=sys.stderr)
    del case, found
    torch.cuda.empty_cache()
    return {"tokens": total, "sequences": sequences, "check": ", ".join(check), **times}


def render_extend(
    rows: list[dict], notes: list[str], heads: tuple[int, int], segments: list[int]
) -> str:
    name = torch.cuda.get_device_name()
    seg_head = "".join(f" | seg {length}" for length in segments)
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"# gdn_extend: {name}",
        "",
        f"- {now}; torch {torch.__version__}; H={heads[0]}, HV={heads[1]}, K=V={V}; bf16",
        "  q/k/v/a/b, fp32 pool; equal-length sequences; times in us per call, eager (module",
        "  docstring).",
        "- 'floor': a copy_ of the bytes each contender moves once; 'fused', 'split': ours",
        "  forced onto each path, the split path's walks unsegmented ('ours' takes the path",
        "  and segments it chooses; 'seg N': segments of N chunks forced); 'A', 'B', 'C':",
        "  ours's split-path kernels (A: every chunk's factors in parallel, B: the walks, C:",
        "  the segments' combine), from the profiler; 'fla / ours', 'original / ours': their",
        "  time over ours (> 1: ours is faster).",
        *notes,
        "",
        f"| tokens | sequences | floor | ours | fused | split{seg_head} | A | B | C | Mtok/s | fla "
        "| fla / ours | original | original / ours | max abs error vs float64 |",
        # every column right-aligned but the last (text)
        "|" + "---:|" * (6 + len(segments) + 8) + "---|",
    ]

    def us(seconds):
        return f"{seconds * 1e6:.0f}" if seconds is not None else "n/a"

    def ratio(seconds, ours):
        return f"{seconds / ours:.2f}x" if seconds is not None and ours else "n/a"

    for row in rows:
        ours = row.get("ours")
        rate = f"{row['tokens'] / ours / 1e6:.1f}" if ours else "n/a"
        lines.append(
            f"| {row['tokens']} | {row['sequences']} | {us(row.get('floor'))} | {us(ours)} | "
            f"{us(row.get('fused'))} | {us(row.get('split'))} | "
            + "".join(f"{us(row.get(f'seg {length}'))} | " for length in segments)
            + f"{us(row.get('factors'))} | {us(row.get('walk'))} | {us(row.get('combine'))} | "
            f"{rate} | {us(row.get('fla'))} | {ratio(row.get('fla'), ours)} | "
            f"{us(row.get('original'))} | {ratio(row.get('original'), ours)} | "
            f"{row['check'] or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main_extend(args: argparse.Namespace) -> str:
    """The extend table (``--extend``)."""
    notes = []
    try:
        import fla
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as chunk_rule

        notes.append(f"- fla {fla.__version__}.")
    except Exception as error:
        chunk_rule = None
        notes.append(f"- fla not available ({error!r}).")
    heads = tuple(int(h) for h in args.heads.split(","))
    example = extend_inputs(128, 2)
    original = _original(
        args.original, "mllm_kernel.cuda.jit.gdn_extend_chunkwise", "gdn_extend_chunkwise",
        example, notes,
    )  # fmt: skip
    segments = [int(n) for n in args.segments.split(",") if n]
    rows = []
    for total in [int(t) for t in args.tokens.split(",") if t]:
        for sequences in [int(n) for n in args.sequences.split(",") if n]:
            print(f"{total} tokens, {sequences} sequences ...", file=sys.stderr, flush=True)
            rows.append(measure_extend(total, sequences, heads, chunk_rule, original, segments))
            # the row at once: a run cut short still shows what it measured
            last = render_extend(rows, notes, heads, segments).splitlines()[-1]
            print(last, file=sys.stderr, flush=True)
    return render_extend(rows, notes, heads, segments)


def _original(root: str | None, module: str, name: str, example: dict, notes: list[str]):
    """The original's function ``name`` of ``module`` from the source tree ``root``
    (None or '': left out), built by a first call on ``example``; None, with a line in
    ``notes`` saying why, where it is not available."""
    if root:
        function = original_peer.load_original(Path(root), module, name, example, "bench_gdn")
        if function is not None:
            return function
    why = "see stderr" if root else "none given: pass --original PATH"
    notes.append(f"- the original (from {root}) not available: {why}.")
    return None


# --- the table --------------------------------------------------------------------------------


def render(rows: list[dict], copy_gbs: float, notes: list[str]) -> str:
    name = torch.cuda.get_device_name()
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        f"# gdn_decode: {name}",
        "",
        f"- {now}; torch {torch.__version__}; H={H}, HV={HV}, K=V={V}, one token per sequence,",
        "  bf16 q/k/v/a/b; times in us per call, CUDA graphs (module docstring).",
        "- 'launch': a kernel that moves nothing; 'floor': a copy_ of the states' bytes (read",
        "  + written), both in the same run; 'x floor':",
        f"  ours over it. 1 GiB copy: {copy_gbs:.0f} GB/s. 'fla / ours', 'original / ours':",
        "  their time over ours (> 1: ours is faster).",
        "- fla's final state goes to a new tensor: 'fla' drops it (a graph's calls then all",
        "  write the same memory, which L2 holds at small batches), 'fla kept' keeps each",
        "  call's (they rotate through HBM as the pool's rows do), 'fla + wb' copies it into",
        "  the pool's rows (what a serving engine adds; ours updates the pool in place).",
        *notes,
        "",
        "| batch | state | state MB | launch | floor | ours | x floor | ours GB/s | fla "
        "| fla / ours | fla kept / ours | fla + wb / ours | original | original / ours "
        "| max abs error vs float64 |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]

    def us(seconds):
        return f"{seconds * 1e6:.2f}" if seconds is not None else "n/a"

    def ratio(seconds, ours):
        return f"{seconds / ours:.2f}x" if seconds is not None and ours else "n/a"

    for row in rows:
        ours = row.get("ours")
        gbs = 2 * row["bytes"] / ours / 1e9 if ours else None
        lines.append(
            f"| {row['batch']} | {str(row['state']).removeprefix('torch.')} | "
            f"{row['bytes'] / 2**20:.0f} | {us(row.get('launch'))} | {us(row.get('floor'))} | "
            f"{us(ours)} | "
            f"{ratio(ours, row.get('floor'))} | {gbs:.0f} | {us(row.get('fla'))} | "
            f"{ratio(row.get('fla'), ours)} | {ratio(row.get('fla, kept'), ours)} | "
            f"{ratio(row.get('fla, write-back'), ours)} | {us(row.get('original'))} | "
            f"{ratio(row.get('original'), ours)} | {row['check'] or '-'} |"
        )
    forced = sorted({name for row in rows for name in row if name.startswith("ours c")})
    if forced:
        lines += [
            "",
            "Forced launch configurations (us; the kernel's choice is 'ours'):",
            "",
            "| batch | state | floor | ours | cold indices | " + " | ".join(forced) + " | fla |",
            "|---:|---|" + "---:|" * (len(forced) + 4),
        ]
        for row in rows:
            cells = [us(row.get(name)) for name in ["floor", "ours", *forced, "fla"]]
            cells.insert(2, us(row.get("ours, cold indices")))
            state = str(row["state"]).removeprefix("torch.")
            lines.append(f"| {row['batch']} | {state} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8,32,128,512")
    parser.add_argument("--bf16-state-batches", default="128,512")
    parser.add_argument("--configs", default="", help="launch configurations to force too")
    parser.add_argument(
        "--original",
        default=original_peer.default_root(),
        help="the original mllm-kernel's source tree (default: _peers/mllm-kernel where "
        "present; '' leaves it out)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--extend", action="store_true", help="gdn_extend instead of decode")
    parser.add_argument("--tokens", default="1024,4096,16384", help="--extend: total tokens")
    parser.add_argument("--sequences", default="1,4,16,64", help="--extend: sequences")
    parser.add_argument("--heads", default=f"{H},{HV}", help="--extend: H,HV (TP8: 2,8)")
    parser.add_argument(
        "--segments", default="", help="--extend: segment lengths (chunks) to force too"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gdn: no CUDA GPU visible; nothing to measure", file=sys.stderr)
        return 1
    torch.manual_seed(0)
    if args.extend:
        table = main_extend(args)
        print(table)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(table)
        return 0
    notes = []
    try:
        import fla
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fused_recurrent

        notes.append(f"- fla {fla.__version__}.")
    except Exception as error:
        fused_recurrent = None
        notes.append(f"- fla not available ({error!r}).")
    example = {n: t for n, t in inputs(2, torch.float32).items() if n != "state_bytes"}
    example["cache_indices"] = torch.arange(2, device="cuda")
    original = _original(
        args.original, "mllm_kernel.cuda.jit.gdn_decode", "gdn_decode", example, notes
    )
    copy_gbs = copy_bandwidth()
    cases = [(int(b), torch.float32) for b in args.batches.split(",") if b]
    cases += [(int(b), BF16) for b in args.bf16_state_batches.split(",") if b]
    configs = [int(c) for c in args.configs.split(",") if c]
    rows = []
    for batch, state_dtype in cases:
        print(f"batch {batch}, {state_dtype} state ...", file=sys.stderr, flush=True)
        rows.append(measure(batch, state_dtype, fused_recurrent, original, configs))
    if any(row["state"] == BF16 for row in rows):
        notes.append("- bf16 state: fla reads it and writes its final state in fp32 (more bytes).")
    table = render(rows, copy_gbs, notes)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
