"""Experiment: the streaming W4A16 kernel's cluster launches under each cluster scheduling
policy (0 default, 1 spread, 2 load balancing), beside the plain read, one line per shape x M."""
import os, sys
from functools import partial

sys.path.insert(0, "benchmarks")
import gemm_harness as harness
import torch
from bench_quant_gemm import WEIGHT_FORMATS, PlainRead
from mllm_kernel.cuda.jit import gptq_marlin as marlin
from mllm_kernel.cuda.jit import gptq_marlin_gemm, marlin_make_workspace

ms = [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "1,16").split(",")]
SHAPES = [(4096, 4096), (6144, 4096), (4096, 14336), (14336, 4096), (28672, 4096), (28672, 8192)]
U4 = WEIGHT_FORMATS["uint4b8"]
read = PlainRead()
for n, k in SHAPES:
    made = [U4.make(n, k) for _ in range(harness.weight_copies(U4.nbytes(n, k), 1))]
    weights = [(q, d[torch.bfloat16][0]) for q, d in made]
    ws = marlin_make_workspace("cuda")
    for m in ms:
        a = harness.random_bf16(m, k)
        outs = {}

        def call(q, s, policy, a=a, m=m):
            os.environ["MLLM_PROBE_CLUSTER_POLICY"] = str(policy)
            out = outs.setdefault(policy, torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
            gptq_marlin_gemm(a, out, q, s, None, None, None, None, ws, U4.type_id, m, n, k)

        cont = {f"p{p}": [partial(call, q, s, p) for q, s in weights] for p in (0, 1, 2)}
        for fns in cont.values():
            fns[0]()
        torch.cuda.synchronize()
        same = all(torch.equal(outs[0], outs[p]) for p in (1, 2))
        how = marlin._calls[(m, n, k, a.get_device(), torch.bfloat16, U4.type_id, False, False, False)].plan
        cont["read"] = read.calls(weights, *read.fastest(n, k, weights))
        t = harness.time_graphs(cont, harness.replays_per_sample(m, n, k))
        cells = " ".join(f"{name} {v*1e6:.2f} ({v/t['read']:.2f}x)" for name, v in t.items())
        print(f"M={m} {n}x{k} split {how.split} same={same}: {cells}", flush=True)
