"""Kernel parameter types: read from an ``extern "C" __global__`` declaration, or from a
``signature=`` string such as ``"const float*, float*, int"``.

Each parameter becomes a :class:`Param` whose ``kind`` is what the native module converts
arguments to: ``"pointer"`` (a tensor of any dtype), ``"pointer:float32"`` (a tensor
that must be float32), or a scalar (``"int32"``, ``"float16"``, ...).

Templates, overloads, references, pointers to pointers and structs passed by value
are out of scope: each raises ValueError saying so and what to write instead.

>>> [p.kind for p in parse_signature("const float* x, half* y, int n, size_t m")]
['pointer:float32', 'pointer:float16', 'int32', 'uint64']
"""

from __future__ import annotations

import platform
import re
from dataclasses import dataclass

from mllm_kernel.jit_utils.cpp_text import code_only, matching_paren, split_top_level

# C spellings of the scalar types the native module passes by value (typedef names; the
# builtin integer spellings such as "unsigned long" are handled by _builtin_integer).
_NAMED_SCALARS = {
    "bool": "bool",
    "int8_t": "int8",
    "int16_t": "int16",
    "int32_t": "int32",
    "int64_t": "int64",
    "uint8_t": "uint8",
    "uint16_t": "uint16",
    "uint32_t": "uint32",
    "uint64_t": "uint64",
    "size_t": "uint64",
    "uintptr_t": "uint64",
    "ptrdiff_t": "int64",
    "intptr_t": "int64",
    "ssize_t": "int64",
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "__half": "float16",
    "nv_bfloat16": "bfloat16",
    "__nv_bfloat16": "bfloat16",
}
_INTEGER_WORDS = frozenset({"signed", "unsigned", "char", "short", "int", "long"})
# Pointers to these take a tensor of any dtype: they are how kernels spell raw bytes.
_BYTE_POINTEES = frozenset({"void", "char", "signed char", "unsigned char"})
_QUALIFIERS = frozenset(
    {"const", "volatile", "restrict", "__restrict", "__restrict__", "__grid_constant__", "struct"}
)
# Declaration attributes that take a parenthesised argument before the kernel's name.
_ATTRIBUTES = frozenset(
    {"__launch_bounds__", "__cluster_dims__", "__maxnreg__", "__attribute__", "__declspec"}
)
# Attributes a parameter may carry ([[maybe_unused]], __attribute__((unused))): they do
# not change how it is passed, and their brackets would read as array or pointer marks.
_ATTRIBUTE_LIST = re.compile(r"\[\[.*?\]\]", re.DOTALL)
_PARAMETER_ATTRIBUTE = re.compile(r"\b(?:__attribute__|__declspec|alignas)\s*\(")
_TOKEN = re.compile(r"[A-Za-z_][\w:]*|\S")
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Plain char is signed on x86 and unsigned on Arm, as the host compiler (and so nvcc) has it.
_PLAIN_CHAR = "uint8" if platform.machine().lower() in ("aarch64", "arm64") else "int8"

SCALAR_SPELLINGS = "bool, (un)signed char/short/int/long, int8_t..uint64_t, size_t, half, " + (
    "__nv_bfloat16, float, double"
)


@dataclass(frozen=True)
class Param:
    """One kernel parameter.

    ``name`` is empty where a ``signature=`` string gives none; ``ctype`` is the type as
    written, qualifiers other than const dropped (``"const float*"``); ``kind`` is what
    the native module converts an argument to; ``const`` says a pointer's data is read-only
    (NumPy arrays passed for it are not copied back).
    """

    index: int
    name: str
    ctype: str
    kind: str
    const: bool = False

    @property
    def is_pointer(self) -> bool:
        return self.kind.startswith("pointer")

    @property
    def label(self) -> str:
        """How errors name the parameter: ``argument 'n' (int)`` or ``argument 2 (int)``."""
        who = f"'{self.name}'" if self.name else str(self.index)
        return f"argument {who} ({self.ctype})"


def _builtin_integer(words: list[str]) -> str | None:
    """``["unsigned", "long"]`` -> ``"uint64"`` (LP64: long is 64-bit); None if not one."""
    if not words or not set(words) <= _INTEGER_WORDS:
        return None
    unsigned = "unsigned" in words
    if "char" in words:
        if "signed" not in words and not unsigned:
            return _PLAIN_CHAR
        bits = 8
    elif "short" in words:
        bits = 16
    elif "long" in words:
        bits = 64
    else:
        bits = 32
    return f"{'u' if unsigned else ''}int{bits}"


def scalar_kind(base: str) -> str | None:
    """The native module's name for C type ``base`` (``"unsigned int"`` -> ``"uint32"``)."""
    base = base.removeprefix("std::")
    return _NAMED_SCALARS.get(base) or _builtin_integer(base.split())


def _is_type_word(word: str) -> bool:
    return word in _INTEGER_WORDS or word.removeprefix("std::") in _NAMED_SCALARS


def _without_attributes(text: str) -> str:
    text = _ATTRIBUTE_LIST.sub(" ", text)
    while match := _PARAMETER_ATTRIBUTE.search(text):
        close = matching_paren(text, match.end() - 1)
        if close is None:  # unbalanced: left for the type check to refuse
            break
        text = f"{text[: match.start()]} {text[close + 1 :]}"
    return text


def parse_param(text: str, index: int, where: str) -> Param:
    """One parameter declaration, e.g. ``const float* __restrict__ x``; attributes
    (``[[maybe_unused]] int n``) are skipped."""
    tokens = _TOKEN.findall(_without_attributes(text))
    shown = " ".join(text.split())
    if "&" in tokens:
        raise ValueError(f"{where}: parameter {shown!r} is a reference: kernels take pointers")
    if "=" in tokens:
        raise ValueError(f"{where}: parameter {shown!r} has a default value: remove it")
    if "<" in tokens:
        raise ValueError(
            f"{where}: parameter {shown!r} has a template type: the runtime launches plain "
            "C parameters (pointers and scalars); templates are out of scope"
        )
    stars = sum(1 for t in tokens if t in ("*", "["))
    words = [t for t in tokens if _IDENTIFIER.fullmatch(t.split("::")[-1])]
    first_star = tokens.index("*") if "*" in tokens else len(tokens)
    const = "const" in tokens[:first_star]
    type_words = [w for w in words if w not in _QUALIFIERS]
    # The last word names the parameter unless it is the type's own (``"unsigned int"``).
    name = type_words.pop() if len(type_words) > 1 and not _is_type_word(type_words[-1]) else ""
    base = " ".join(type_words)
    if not base:
        raise ValueError(f"{where}: cannot read a type from parameter {shown!r}")
    ctype = ("const " if const else "") + base + "*" * stars
    label = f"parameter {name!r} ({ctype})" if name else f"parameter {index} ({ctype})"
    if stars > 1:
        raise ValueError(
            f"{where}: {label} is a pointer to pointer, which the runtime cannot pass: "
            "pass one flat buffer (and offsets into it) instead"
        )
    if stars == 1:
        pointee = scalar_kind(base)
        checked = pointee is not None and base not in _BYTE_POINTEES
        kind = f"pointer:{pointee}" if checked else "pointer"
        return Param(index, name, ctype, kind, const)
    kind = scalar_kind(base)
    if kind is None:
        raise ValueError(
            f"{where}: {label} is passed by value, but the runtime passes only pointers and "
            f"the scalars {SCALAR_SPELLINGS}: pass a pointer to it instead"
        )
    return Param(index, name, ctype, kind)


def parse_params(text: str, where: str) -> tuple[Param, ...]:
    """A comma-separated parameter list (``"void"`` or empty: no parameters)."""
    parts = split_top_level(text)
    if len(parts) == 1 and parts[0].strip() in ("", "void"):
        return ()
    empty = [i for i, p in enumerate(parts) if not p.strip()]
    if empty:
        raise ValueError(f"{where}: parameter {empty[0]} is empty in {text.strip()!r}")
    return tuple(parse_param(p, i, where) for i, p in enumerate(parts))


def parse_signature(signature: str) -> tuple[Param, ...]:
    """Parameters from a ``signature=`` string: ``"const float* x, float* y, int n"``
    (names optional: ``"const float*, float*, int"``)."""
    if not isinstance(signature, str):
        raise TypeError(f"signature must be a str like 'const float*, int', got {signature!r}")
    return parse_params(signature.strip().removeprefix("(").removesuffix(")"), "signature")


# ---------------------------------------------------------------------------
# Finding a kernel's declaration in CUDA source text.
# ---------------------------------------------------------------------------
_EXTERN_C_BLOCK = re.compile(r'extern\s+"C"\s*$')
_EXTERN_C = re.compile(r'extern\s+"C"')
_TEMPLATE = re.compile(r"\btemplate\b")
_GLOBAL = re.compile(r"\b__global__\b")
_WORD = re.compile(r"\s*([A-Za-z_]\w*)\s*")


@dataclass(frozen=True)
class _Declaration:
    name: str
    params_text: str
    line: int
    extern_c: bool
    template: bool


def _extern_c_blocks(code: str) -> list[tuple[int, int]]:
    """``(start, end)`` offsets of every ``extern "C" { ... }`` block."""
    blocks, stack = [], []
    for i, char in enumerate(code):
        if char == "{":
            stack.append((i, bool(_EXTERN_C_BLOCK.search(code[max(0, i - 64) : i]))))
        elif char == "}" and stack:
            start, is_extern = stack.pop()
            if is_extern:
                blocks.append((start, i))
    return blocks


def _declarations(code: str) -> list[_Declaration]:
    """Every ``__global__`` function declared or defined in ``code``."""
    found = []
    blocks = _extern_c_blocks(code)
    for match in _GLOBAL.finditer(code):
        statement_start = max(code.rfind(c, 0, match.start()) for c in ";{}") + 1
        prefix = code[statement_start : match.start()]
        pos = match.end()
        while True:
            word = _WORD.match(code, pos)
            if not word:
                break
            after = word.end()
            if after < len(code) and code[after] == "(":
                close = matching_paren(code, after)
                if close is None:  # unbalanced: no declaration to read
                    break
                if word.group(1) in _ATTRIBUTES:
                    pos = close + 1
                    continue
                found.append(
                    _Declaration(
                        name=word.group(1),
                        params_text=code[after + 1 : close],
                        line=code.count("\n", 0, word.start(1)) + 1,
                        extern_c=bool(_EXTERN_C.search(prefix))
                        or any(s < match.start() < e for s, e in blocks),
                        template=bool(_TEMPLATE.search(prefix)),
                    )
                )
                break
            pos = after
    return found


def kernel_params(source: str, name: str, where: str = "<source>") -> tuple[Param, ...]:
    """The parameters of ``extern "C" __global__ void name(...)`` in CUDA ``source``.

    ``where`` names the source in errors (a file path, or ``<source>``).
    """
    declarations = _declarations(code_only(source, directives=True))
    mine = [d for d in declarations if d.name == name]
    if not mine:
        kernels = sorted({d.name for d in declarations if d.extern_c and not d.template})
        listed = ", ".join(kernels) if kernels else "none"
        raise ValueError(
            f'{where}: no extern "C" __global__ kernel named {name!r} (kernels found: '
            f"{listed}); if a macro hides its declaration, pass signature='...' to "
            "compile_kernel instead"
        )
    first = mine[0]
    at = f"{where}:{first.line}"
    if any(d.template for d in mine):
        raise ValueError(
            f'{at}: kernel {name!r} is a template; the runtime launches extern "C" kernels, '
            'templates are out of scope: add an extern "C" __global__ kernel that calls the '
            "instantiation you need"
        )
    if not all(d.extern_c for d in mine):
        raise ValueError(
            f'{at}: kernel {name!r} is not declared extern "C", so its symbol is C++-mangled '
            'and cannot be looked up by name: declare it extern "C" __global__'
        )
    declared = [parse_params(d.params_text, f"{where}:{d.line}") for d in mine]
    # A forward declaration names its parameters or not: only their types must agree.
    types = {tuple((p.ctype, p.kind, p.const) for p in params) for params in declared}
    if len(types) > 1:
        lines = ", ".join(str(d.line) for d in mine)
        raise ValueError(
            f"{at}: kernel {name!r} is overloaded or declared twice with different "
            f"parameters (lines {lines}; the preprocessor's branches are not evaluated): "
            "give each kernel its own name, or pass signature='...' to compile_kernel"
        )
    return max(declared, key=lambda params: sum(bool(p.name) for p in params))
