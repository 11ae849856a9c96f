"""Finding the C++ function a wrapper expression names, in the user's sources.

A wrapper exports ``my_namespace::my_kernel<fp32_t>``; when it does not compile, or a
call passes the wrong kind of argument, the error is clearer with the function's
declaration (``my_kernel.cpp:9: template <int kScale> void my_kernel(...)``) and its
parameter names. This is a reader for the common shapes of a declaration, not a C++
parser: what it cannot find, it does not report (callers then say less, never
something wrong).

>>> function_name("my_namespace::my_kernel<fp32_t, 4>")
'my_kernel'
>>> [p.name for p in parse_parameters("tvm::ffi::TensorView out, const float* x, int = 3")]
['out', 'x', None]
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils.cpp_text import code_only, matching_paren, split_top_level

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)
# Words that can stand before a call but never before a declared function's name.
_NOT_A_TYPE = frozenset(
    {"return", "else", "case", "throw", "new", "delete", "co_return", "co_yield", "sizeof"}
)
MAX_FILES = 64  # quoted includes followed from the sources, at most


@dataclass(frozen=True)
class Parameter:
    """One parameter: its C++ type text and its name (None where it has none)."""

    type: str
    name: str | None


@dataclass(frozen=True)
class Declaration:
    """A function declared at ``path:line`` (the line of ``template``, if it has one):
    ``text`` is its head up to the closing parenthesis, on one line."""

    path: Path
    line: int
    text: str
    parameters: tuple[Parameter, ...]

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def function_name(expression: str) -> str | None:
    """The unqualified name of the function ``expression`` names (``ns::f<3>``, ``&ns::f``,
    ``(ns::f)``), or None for anything else (a lambda, a call)."""
    text = expression.strip()
    while text.startswith("(") and text.endswith(")"):
        text = text[1:-1].strip()
    text = text.lstrip("&").strip()
    head = re.match(r"[\w:\s]*", text)
    name = (head[0] if head else "").strip().rsplit("::", 1)[-1].strip()
    rest = text[len(head[0]) if head else 0 :].strip()
    if not _IDENTIFIER.fullmatch(name) or (rest and not rest.startswith("<")):
        return None
    return name


def parse_parameters(text: str) -> tuple[Parameter, ...]:
    """The parameters of a declaration's parameter list (the text between its
    parentheses), defaults dropped."""
    if text.strip() in ("", "void"):
        return ()
    parameters = []
    for item in split_top_level(text):
        declared = split_top_level(item, "=")[0].strip()
        match = re.search(r"(?<=[\s*&])([A-Za-z_]\w*)$", declared)
        if match and declared[: match.start()].strip():
            parameters.append(Parameter(declared[: match.start()].strip(), match[1]))
        else:
            parameters.append(Parameter(declared, None))
    return tuple(parameters)


def _statement_start(text: str, end: int) -> int:
    """Where the statement holding ``end`` starts: after the last ``;``, ``{`` or ``}``
    before it, past preprocessor lines and blanks."""
    start = max(text.rfind(c, 0, end) for c in ";{}") + 1
    while True:
        rest = text[start:end]
        stripped = rest.lstrip()
        if stripped.startswith("#"):
            newline = text.find("\n", start + len(rest) - len(stripped))
            start = end if newline < 0 or newline >= end else newline + 1
            continue
        return start + len(rest) - len(stripped)


def _declarations_in(path: Path, text: str, name: str) -> list[Declaration]:
    code = code_only(text)
    found = []
    for match in re.finditer(rf"(?<![\w.>:])(?:\w+::)*{re.escape(name)}\s*\(", code):
        before = code[: match.start()].rstrip()
        previous = re.search(r"([\w>*&]+)$", before)
        if not previous or previous[1] in _NOT_A_TYPE or previous[1].isdigit():
            continue
        close = matching_paren(code, match.end() - 1)
        if close is None:
            continue
        after = code[close + 1 :].lstrip()
        if not re.match(r"[{;]|const\b|noexcept\b|->|override\b|requires\b", after):
            continue
        start = _statement_start(code, match.start())
        head = " ".join(code[start : close + 1].split())
        found.append(
            Declaration(
                path,
                code.count("\n", 0, start) + 1,
                head,
                parse_parameters(code[match.end() : close]),
            )
        )
    return found


def _closure(files: Iterable[Path], include_dirs: Iterable[Path]) -> list[tuple[Path, str]]:
    """``files`` and the files their quoted includes reach (found beside the including
    file or in ``include_dirs``), with their text; unreadable ones are skipped."""
    pending, seen, out = list(files), set(), []
    dirs = list(include_dirs)
    while pending and len(out) < MAX_FILES:
        path = pending.pop(0)
        if path in seen:
            continue
        seen.add(path)
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        out.append((path, text))
        for included in _QUOTED_INCLUDE.findall(text):
            for base in (path.parent, *dirs):
                candidate = (base / included).resolve()
                if candidate.is_file():
                    pending.append(candidate)
                    break
    return out


def find_declarations(
    name: str, files: Iterable[Path], include_dirs: Iterable[Path] = ()
) -> list[Declaration]:
    """Every declaration of the function ``name`` in ``files`` and the user headers they
    include (quoted includes found beside them or in ``include_dirs``), in file order."""
    return [
        declaration
        for path, text in _closure(files, include_dirs)
        for declaration in _declarations_in(path, text, name)
    ]
