"""Reading C++ source as text: what the declaration readers share (the raw runtime's
kernel signatures, :mod:`.cpp_declarations`'s wrapped functions).

Not a C++ parser: comments and literals blanked, brackets balanced, lists split at the
top level. Offsets and line numbers of the blanked text are those of the source.

>>> split_top_level("std::pair<int, int> p, float* x")
['std::pair<int, int> p', ' float* x']
"""

from __future__ import annotations

import re

_COMMENT_OR_LITERAL = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL
)
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.MULTILINE)
_OPEN, _CLOSE = "(<[{", ")>]}"


def _blank(match: re.Match[str]) -> str:
    text = match.group(0)
    if text == '"C"':
        return text  # the one string literal a declaration holds: extern "C"
    return re.sub(r"[^\n]", " ", text)


def code_only(source: str, *, directives: bool = False) -> str:
    """``source`` with comments and string and character literals (but ``extern "C"``'s)
    replaced by spaces, newlines kept; with ``directives``, preprocessor lines too."""
    code = _COMMENT_OR_LITERAL.sub(_blank, source)
    return _DIRECTIVE.sub(_blank, code) if directives else code


def matching_paren(text: str, open_at: int) -> int | None:
    """The index of the parenthesis that closes the one at ``open_at``, or None."""
    depth = 0
    for index in range(open_at, len(text)):
        if text[index] == "(":
            depth += 1
        elif text[index] == ")":
            depth -= 1
            if depth == 0:
                return index
    return None


def split_top_level(text: str, separator: str = ",") -> list[str]:
    """``text`` split at ``separator`` outside any (), <>, [] or {}."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in _OPEN:
            depth += 1
        elif char in _CLOSE:
            depth = max(depth - 1, 0)
        elif char == separator and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts
