"""The ``mllm_kernel`` logger: one INFO line per cold build, warnings for rebuilt caches.

By default it writes to stderr by itself (level from ``MLLM_KERNEL_LOG_LEVEL``,
default INFO), so that a first call that compiles for 10 s says so. An
application with its own logging set-up calls :func:`use_application_logging`
instead, and the records go to its handlers.
"""

from __future__ import annotations

import logging
import sys

from mllm_kernel.jit_utils import env

LOGGER_NAME = "mllm_kernel"


class _OwnStderrHandler(logging.StreamHandler):
    """The handler :func:`get_logger` adds, told apart from any the application adds."""


def get_logger() -> logging.Logger:
    """The ``mllm_kernel`` logger; the first call gives it its own stderr handler and
    stops propagation, unless :func:`use_application_logging` came first."""
    logger = logging.getLogger(LOGGER_NAME)
    if not getattr(logger, "_mllm_kernel_configured", False):
        handler = _OwnStderrHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("[mllm_kernel] %(levelname)s %(message)s"))
        logger.addHandler(handler)
        level = env.log_level()
        known = isinstance(logging.getLevelName(level), int)  # a name's number, else text
        logger.setLevel(level if known else logging.INFO)
        logger.propagate = False
        logger._mllm_kernel_configured = True  # type: ignore[attr-defined]
        if not known:  # a typo in a setting must not stop the import
            logger.warning(
                "MLLM_KERNEL_LOG_LEVEL=%r is not a level (DEBUG, INFO, WARNING, ERROR, "
                "CRITICAL); using INFO",
                level,
            )
    return logger


def use_application_logging() -> logging.Logger:
    """Routes the ``mllm_kernel`` logger into the application's logging: removes its own
    stderr handler and lets records propagate to the root logger's handlers. Call it
    before or after importing the ops. The logger keeps its level
    (``MLLM_KERNEL_LOG_LEVEL``, default INFO); ``setLevel`` on it changes that.

    >>> import logging
    >>> from mllm_kernel.jit_utils import use_application_logging
    >>> logging.basicConfig(format="%(name)s %(levelname)s %(message)s")
    >>> use_application_logging().name
    'mllm_kernel'
    """
    logger = get_logger()
    for handler in [h for h in logger.handlers if isinstance(h, _OwnStderrHandler)]:
        logger.removeHandler(handler)
    logger.propagate = True
    return logger
