"""``python -m mllm_kernel <command>``; the ``mllm-kernel`` script calls :func:`main` too."""

from __future__ import annotations

import sys

from mllm_kernel.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
