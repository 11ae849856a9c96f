"""The ``mllm_kernel`` logger: one INFO line per cold build, warnings for rebuilt caches.

It writes to stderr by itself (level from ``MLLM_KERNEL_LOG_LEVEL``, default
INFO) so that a first call that compiles for 10 s says so. To route it through
your own logging setup instead::

    logging.getLogger("mllm_kernel").handlers.clear()
    logging.getLogger("mllm_kernel").propagate = True
"""

from __future__ import annotations

import logging
import sys

from mllm_kernel.jit_utils import env

LOGGER_NAME = "mllm_kernel"


def get_logger() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not getattr(logger, "_mllm_kernel_configured", False):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[mllm_kernel] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(env.log_level())
        logger.propagate = False
        logger._mllm_kernel_configured = True  # type: ignore[attr-defined]
    return logger
