"""Terminal output for the CLI: aligned tables, and colour only on a terminal."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, TextIO

_ANSI = re.compile(r"\033\[[0-9;]*m")
_COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


def use_colour(stream: TextIO | None = None) -> bool:
    """Colour only on a terminal, and never with ``NO_COLOR`` set or ``TERM=dumb``."""
    stream = sys.stdout if stream is None else stream
    if os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return False
    return bool(getattr(stream, "isatty", lambda: False)())


def paint(text: str, colour: str, enabled: bool | None = None) -> str:
    """``text`` in ``colour`` (red, green, yellow, bold, dim) where :func:`use_colour`."""
    if not (use_colour() if enabled is None else enabled):
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> str:
    """Rows under headers, columns padded to their widest cell (colour codes not counted)."""
    cells = [list(headers), *[list(map(str, row)) for row in rows]]
    widths = [max(len(_ANSI.sub("", row[i])) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            cell + " " * (width - len(_ANSI.sub("", cell)))
            for cell, width in zip(row, widths, strict=True)
        ]
        lines.append((indent + "  ".join(padded)).rstrip())
    return "\n".join(lines)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout (paths and other objects as strings)."""
    print(json.dumps(data, indent=2, sort_keys=False, default=str))
