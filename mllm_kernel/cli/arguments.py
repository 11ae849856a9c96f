"""Argument converters shared by the CLI's commands (argparse ``type=``)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def number_at_least(minimum: float, what: str, *, integer: bool = False) -> Callable[[str], float]:
    """A converter of text to a number (an int with ``integer``) of at least ``minimum``;
    anything else is an ``ArgumentTypeError`` saying ``expected <what>, got <text>``.

    >>> number_at_least(1, "a positive integer", integer=True)("4")
    4
    """

    def convert(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            value = math.nan
        if not value >= minimum:  # also refuses nan
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    convert.__name__ = what  # argparse names the converter in its own messages
    return convert
