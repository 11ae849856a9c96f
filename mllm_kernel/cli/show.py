"""``show-env`` and ``show-config``: what this machine has, and what the cache holds."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from mllm_kernel.cli import env_info
from mllm_kernel.cli.output import (
    NOT_FOUND,
    format_bytes,
    format_cache_root,
    format_env,
    format_jit_arch,
    paint,
    print_json,
    table,
)
from mllm_kernel.jit_utils import cache_admin, registry
from mllm_kernel.jit_utils.cuda_arch import CudaArch, OpArchs, op_archs, parse_arch_list
from mllm_kernel.jit_utils.errors import CudaArchError
from mllm_kernel.jit_utils.spec import DEVICES
from mllm_kernel.jit_utils.status import VariantState

_STATUS_COLOUR = {
    VariantState.CACHED: "green",
    VariantState.PREBUILT: "green",
    VariantState.NOT_BUILT: "yellow",
    VariantState.STALE: "yellow",
    VariantState.CORRUPT: "red",
    VariantState.UNTRUSTED: "red",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``show-env`` and ``show-config`` to the CLI."""
    show_env = subparsers.add_parser(
        "show-env",
        help="OS, CPU, CUDA, PyTorch and tool versions",
        description="Print the OS, Python, CPU (cores, ISA), CUDA toolkit, driver, PyTorch, "
        "GPUs, the versions of mllm-kernel's dependencies and the cache root.",
    )
    show_env.add_argument("--json", action="store_true", help="print one JSON object")
    show_env.set_defaults(func=run_show_env)

    show_config = subparsers.add_parser(
        "show-config",
        help="registered kernels, their variants and what is cached",
        description="Print an environment summary, then every registered kernel by device "
        "with its template variants and cache status, the archs each CUDA op runs on (by "
        "kernel module), and cached modules that no registered kernel claims (user kernels "
        "from earlier processes).",
    )
    show_config.add_argument(
        "--arch",
        metavar="LIST",
        help="compute CUDA statuses for these archs (e.g. 9.0a or '8.0;9.0a') instead of the GPU's",
    )
    show_config.add_argument("--device", choices=DEVICES, help="only this device")
    show_config.add_argument("--json", action="store_true", help="print one JSON object")
    show_config.set_defaults(func=run_show_config)


def run_show_env(args: argparse.Namespace) -> int:
    """Prints :func:`.env_info.collect`."""
    info = env_info.collect()
    if args.json:
        print_json(info)
    else:
        print(format_env(info))
    return 0


def _status_json(status: Any) -> dict[str, Any]:
    data = dataclasses.asdict(status)
    data["path"] = str(status.path) if status.path else None
    data["template_args"] = list(status.template_args)
    return data


def _ops_json(ops: list[OpArchs]) -> list[dict[str, Any]]:
    return [
        {
            "op": op.op,
            "runs_on": op.describe(),
            "modules": [
                {"name": name, "runs_on": support.describe(), "uses": support.uses or None}
                for name, support in op.modules
            ],
        }
        for op in ops
    ]


def config_json(report: cache_admin.ConfigReport, info: dict[str, Any]) -> dict[str, Any]:
    """The JSON object ``show-config --json`` prints (``cuda_ops``: the archs each CUDA
    op runs on, by kernel module; empty with ``--device cpu``)."""
    return {
        "env": info,
        "cuda_arch": env_info.jit_cuda_arch(report.arch),
        "cuda_ops": _ops_json(_cuda_ops(report)),
        "kernels": [
            {
                "name": k.name,
                "device": k.device,
                "builtin": k.builtin,
                "exports": list(k.exports),
                "sources": list(k.sources),
                "runs_on": k.archs or None,
                "variants": [_status_json(s) for s in k.variants],
            }
            for k in report.kernels
        ],
        "unclaimed_modules": [
            {
                "path": str(m.path),
                "name": m.name,
                "device": m.device,
                "template_args": m.manifest.template_args if m.manifest else None,
                "size_bytes": m.size_bytes,
                "built_at": m.built_at,
                "sources": list(m.sources),
                "error": m.error or None,
            }
            for m in report.unclaimed
        ],
        "other_builds_of_registered_kernels": report.other_builds,
    }


def _summary(info: dict[str, Any], arch: dict[str, Any]) -> str:
    versions, cuda, torch_ = info["versions"], info["cuda"], info["torch"]
    if torch_.get("version") is None:
        gpus = "torch not found"
    elif torch_["gpus"]:
        gpus = ", ".join(f"{g['name']} ({g['arch']})" for g in torch_["gpus"])
    else:
        gpus = "none visible"
    nvcc = f"{cuda['nvcc']} ({cuda['nvcc_version']})" if cuda["toolkit"] else NOT_FOUND
    rows = [
        ("mllm-kernel", versions["mllm_kernel"]),
        ("apache-tvm-ffi", versions["apache_tvm_ffi"] or NOT_FOUND),
        ("torch", torch_.get("version") or NOT_FOUND),
        ("GPUs", gpus),
        ("C++ compiler", versions["cxx"] or NOT_FOUND),
        ("nvcc", nvcc),
        ("CUDA arch", format_jit_arch(arch)),
        ("cache root", format_cache_root(info)),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _cuda_kernels_without_gpu(kernels: list[cache_admin.KernelReport]) -> list[str]:
    """The CUDA section on a machine with no GPU and no arch named: one line per kernel
    (no variant can be keyed without an arch), and how to see their statuses."""
    if not kernels:
        return ["  (none registered)"]
    rows = [
        (
            kernel.name if kernel.builtin else f"{kernel.name} (user)",
            ", ".join(kernel.exports) or "-",
            str(len(kernel.variants)),
            kernel.archs,
        )
        for kernel in kernels
    ]
    return [
        "  not built on this machine (no GPU, and no arch named); `show-config --arch 9.0a` "
        "shows each variant's cache status for that arch",
        table(("kernel", "exports", "variants", "runs on"), rows),
    ]


def _cuda_ops(report: cache_admin.ConfigReport) -> list[OpArchs]:
    """The archs each registered CUDA op runs on (:func:`~.cuda_arch.op_archs`, from the
    kernel modules' declarations); none where the report leaves CUDA out."""
    if report.device not in (None, "cuda"):
        return []
    return op_archs(registry.kernels("cuda"))


def _ops_section(ops: list[OpArchs]) -> list[str]:
    """show-config's table of :func:`_cuda_ops`: one row per kernel module, under its op
    (the op's union of archs on its first row)."""
    rows = []
    for op in ops:
        for number, (name, support) in enumerate(op.modules):
            first = number == 0
            rows.append(
                (
                    op.op if first else "",
                    op.describe() if first else "",
                    name,
                    support.describe(),
                    support.uses or "-",
                )
            )
    header = ("op", "runs on", "kernel module", "its archs", "because it uses")
    return ["", paint("CUDA ops and the archs they run on", "bold"), table(header, rows)]


def _not_here(
    kernel: cache_admin.KernelReport, archs: tuple[CudaArch, ...], ops: list[OpArchs]
) -> tuple[str, ...] | None:
    """The one row of a CUDA kernel whose module runs on none of ``archs`` (the archs
    statuses are computed for: no build of it can exist there), else None."""
    found = next(
        ((op, support) for op in ops for name, support in op.modules if name == kernel.name),
        None,
    )
    if not archs or found is None:
        return None
    op, support = found
    if any(support.supports(arch) for arch in archs):
        return None
    instead = sorted({name for arch in archs for name in op.modules_for(arch)})
    there = (
        f"op {op.op} has {', '.join(instead)} here" if instead else f"op {op.op} has no kernel here"
    )
    variants = len(kernel.variants)
    return (
        kernel.name,
        ", ".join(kernel.exports) or "-",
        f"{variants} variant{'s' if variants != 1 else ''}",
        paint(f"not for {', '.join(f'sm_{arch.number}' for arch in archs)}", "dim"),
        "-",
        f"it runs on {support.explain()}; {there}",
    )


def _variant_rows(
    kernel: cache_admin.KernelReport, arch_error: str | None, footnotes: list[str]
) -> tuple[list[tuple[str, ...]], bool]:
    """``(table rows of kernel's variants, whether one is unknown for want of an arch)``;
    an unknown status's other reasons are added to ``footnotes``, once each."""
    name = kernel.name if kernel.builtin else f"{kernel.name} (user)"
    exports = ", ".join(kernel.exports) or "-"
    rows, unknown_arch = [], False
    for status in kernel.variants:
        if status.status == VariantState.CACHED:
            where = str(status.path)
        elif status.status == VariantState.PREBUILT:
            where = f"{status.path} (from {status.detail})"
        elif status.status == VariantState.UNKNOWN and status.detail == arch_error:
            unknown_arch = True
            where = 'no CUDA arch (see "CUDA arch" above)'
        elif status.status == VariantState.UNKNOWN:
            if status.detail not in footnotes:
                footnotes.append(status.detail)
            where = f"see [{footnotes.index(status.detail) + 1}] below"
        else:
            where = status.detail or "-"
        rows.append(
            (
                name,
                exports,
                ", ".join(status.template_args) or "-",
                paint(status.status, _STATUS_COLOUR.get(status.status, "dim")),
                format_bytes(status.size_bytes),
                where,
            )
        )
    if not kernel.variants:
        rows.append((name, exports, "-", "no variants listed", "-", "-"))
    return rows, unknown_arch


def format_config(report: cache_admin.ConfigReport, info: dict[str, Any]) -> str:
    """``show-config``'s text: the summary, kernel tables by device, unclaimed modules.

    On a machine with no GPU and no arch named, the CUDA kernels are one line each
    (their variants cannot be keyed there), as is a CUDA kernel whose module runs on none
    of the archs statuses are computed for; user kernels say what they are built from.
    """
    arch = env_info.jit_cuda_arch(report.arch)
    ops = _cuda_ops(report)
    # The archs the CUDA statuses are computed for, where known.
    in_use = parse_arch_list(";".join(arch["archs"])) if arch["archs"] else ()
    # Why the CUDA arch is unknown is said once, in the summary; variants it leaves
    # unknown point there.
    arch_error = (arch.get("error") or "").split("\n")[0] or None
    cuda_not_built_here = bool(arch.get("no_gpu")) and report.arch is None
    out = [_summary(info, arch)]
    unknown_arch = False
    for device in DEVICES:
        # An unknown status's reason, printed once per distinct reason under its table.
        footnotes: list[str] = []
        kernels = [k for k in report.kernels if k.device == device]
        out.append("")
        out.append(paint(f"{device.upper()} kernels", "bold"))
        if report.device not in (None, device):
            out.append(f"  not shown (--device {report.device})")
            continue
        if device == "cuda" and cuda_not_built_here:
            out += _cuda_kernels_without_gpu(kernels)
        elif not kernels:
            out.append("  (none registered)")
            continue
        else:
            rows = []
            for kernel in kernels:
                collapsed = _not_here(kernel, in_use, ops) if device == "cuda" else None
                if collapsed is not None:
                    rows.append(collapsed)
                    continue
                kernel_rows, kernel_unknown_arch = _variant_rows(kernel, arch_error, footnotes)
                rows += kernel_rows
                unknown_arch |= kernel_unknown_arch
            header = ("kernel", "exports", "variant", "status", "size", "path / detail")
            out.append(table(header, rows))
            out += [f"  [{number}] {detail}" for number, detail in enumerate(footnotes, 1)]
        out += [
            f"  {k.name} (user) is built from {', '.join(k.sources)}" for k in kernels if k.sources
        ]
    if unknown_arch and report.arch is None:
        out.append("  (pass --arch LIST, e.g. --arch 9.0a, to compute CUDA statuses for an arch)")
    if ops:
        out += _ops_section(ops)
    out.append("")
    out.append(paint("Other cached modules (no registered kernel claims them)", "bold"))
    if report.unclaimed:
        rows = [
            (
                m.name or "?",
                m.device or "?",
                ", ".join(m.manifest.template_args) if m.manifest else "-",
                format_bytes(m.size_bytes),
                ", ".join(m.sources) or "-",
                str(m.path) + (f" ({m.error})" if m.error else ""),
            )
            for m in report.unclaimed
        ]
        out.append(table(("name", "device", "variant", "size", "built from", "path"), rows))
    else:
        out.append("  (none)")
    if report.other_builds:
        out.append(
            f"\n{report.other_builds} cached build(s) of the package's kernels match no key here "
            "(another arch, toolchain or version); `clear-cache --older-than DAYS` prunes them."
        )
    return "\n".join(out)


def run_show_config(args: argparse.Namespace) -> int:
    """Prints :func:`mllm_kernel.jit_utils.cache_admin.config_report` with an env summary."""
    try:
        report = cache_admin.config_report(device=args.device, arch=args.arch)
    except CudaArchError as exc:
        raise SystemExit(f"mllm_kernel show-config: error: {exc}") from None
    info = env_info.collect()
    if args.json:
        print_json(config_json(report, info))
    else:
        print(format_config(report, info))
    return 0
