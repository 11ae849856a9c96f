"""``clear-cache``: remove cached builds, never a build in progress or anything outside."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mllm_kernel.cli import env_info
from mllm_kernel.cli.arguments import number_at_least
from mllm_kernel.cli.output import format_bytes, format_cache_root, paint
from mllm_kernel.jit_utils import cache_admin


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``clear-cache`` to the CLI."""
    parser = subparsers.add_parser(
        "clear-cache",
        help="remove cached kernel builds",
        description="Remove cached modules (all, one kernel's, or old ones), interrupted "
        "builds left in .staging and failure logs. Modules being built are skipped; "
        "nothing outside the cache root is touched and symlinks are never followed.",
    )
    parser.add_argument(
        "--kernel",
        metavar="NAME",
        action="append",
        help="only this kernel's builds (repeat for several); a name neither cached nor "
        "registered is an error (exit 2)",
    )
    parser.add_argument(
        "--older-than",
        metavar="DAYS",
        type=number_at_least(0, "a number of days >= 0"),
        help="only builds older than DAYS (e.g. 7, 0.5)",
    )
    parser.add_argument("--dry-run", action="store_true", help="show what would be removed")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Runs :func:`mllm_kernel.jit_utils.cache_admin.clear_cache` and prints its report.

    Exit status 2 for an unknown ``--kernel`` name (nothing removed), 1 when no cache
    root can be used."""
    root = env_info.cache_root_info()
    if root["cache_root_in_use"] is None:
        print(f"mllm_kernel clear-cache: error: {root['cache_root_problem']}", file=sys.stderr)
        return 1
    if root["cache_root_problem"]:
        print(paint(f"note: the cache in use is {format_cache_root(root)}", "yellow"))
    try:
        report = cache_admin.clear_cache(
            kernel=args.kernel,
            older_than_days=args.older_than,
            dry_run=args.dry_run,
            root=Path(root["cache_root_in_use"]),
        )
    except ValueError as exc:  # an unknown --kernel name: nothing was removed
        print(f"mllm_kernel clear-cache: error: {exc}", file=sys.stderr)
        return 2
    verb = "would remove" if report.dry_run else "removed"
    for item in report.removed:
        print(f"{verb} {item.kind:<7} {format_bytes(item.size_bytes):>10}  {item.path}")
    for path in report.busy:
        print(paint(f"skipped (a build holds its lock): {path}", "yellow"))
    for path, why in report.skipped:
        print(paint(f"skipped ({why}): {path}", "yellow"))
    print(
        f"{verb} {report.count} item(s), {format_bytes(report.bytes)} "
        f"{'reclaimable' if report.dry_run else 'reclaimed'} in {report.root}"
    )
    return 0
