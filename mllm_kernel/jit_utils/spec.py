"""A module build described as data: what to compile, how, and its cache key."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from mllm_kernel.jit_utils.cuda_arch import CudaArch

# The devices a module is built for: every list of devices in the package is this one.
DEVICES = ("cpu", "cuda")

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
# Every character Python, C or C++ may treat as ending a line, and NUL: text that holds
# one could end the generated line early and start a preprocessor directive.
_LINE_BREAK = re.compile("[\x00\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
# A module name becomes file names (<name>.so, <dirname>.lock, staging dirs) that must
# stay below NAME_MAX (255) with the device, template args and hash added.
MAX_NAME_LENGTH = 100

# Bump when the generated code or the manifest layout changes meaning.
# 3: deps by the path as opened, toolchain fingerprints with ctime and sha256.
CACHE_FORMAT = 3


def check_one_line(text: str, what: str) -> str:
    """``text`` if it is one non-empty line of C++; else ValueError naming ``what``.

    >>> check_one_line("my_ns::f<3>", "wrapper 'f'")
    'my_ns::f<3>'
    """
    if not text.strip() or _LINE_BREAK.search(text):
        raise ValueError(
            f"{what} must be one non-empty line of C++ (no line breaks such as \\n or \\r, "
            f"no NUL), got {text!r}"
        )
    return text


def check_includable(path: Path) -> Path:
    """``path`` if it can be written between the quotes of an ``#include "..."`` line;
    ValueError for one holding a double quote or a line break, which would end that line
    early and let the rest of the name be read as code.

    >>> check_includable(Path("/src/my kernels/add.cpp")).name
    'add.cpp'
    """
    text = str(path)
    if '"' in text or _LINE_BREAK.search(text):
        raise ValueError(
            f"source path {text!r} cannot be written in an #include line (it holds a double "
            "quote or a line break): rename the file or move it to a directory without them"
        )
    return path


def check_module_name(name: object) -> str:
    """``name`` if it is a C identifier of at most MAX_NAME_LENGTH characters; else
    TypeError (not a str) or ValueError saying which rule it breaks.

    >>> check_module_name("rmsnorm")
    'rmsnorm'
    """
    if not isinstance(name, str):
        raise TypeError(f"module name must be a str, got {type(name).__name__}")
    if not _IDENTIFIER.fullmatch(name) or not name.isascii():
        raise ValueError(
            f"module name {name!r} must be a C identifier (ASCII letters, digits and '_', "
            "not starting with a digit)"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"module name {name[:20]!r}... has {len(name)} characters; at most "
            f"{MAX_NAME_LENGTH} are allowed (it names files in the cache)"
        )
    return name


@dataclass(frozen=True)
class Wrapper:
    """Exports ``expression`` (a function or template instantiation) as ``export_name``."""

    export_name: str
    expression: str

    def __post_init__(self) -> None:
        if not _IDENTIFIER.fullmatch(self.export_name):
            raise ValueError(f"wrapper export name {self.export_name!r} is not a C identifier")
        check_one_line(self.expression, f"the C++ expression of wrapper {self.export_name!r}")

    def render(self) -> str:
        # The parentheses keep commas of template arguments out of the macro's arguments.
        return f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({self.export_name}, ({self.expression}));"


@dataclass(frozen=True)
class BuildSpec:
    """Everything that decides one module's binary, except the toolchain and headers.

    ``key_material`` adds the toolchain identity and versions; the include
    closure of the sources is checked from the manifest at load time.
    """

    name: str
    device: str  # one of DEVICES
    template_args: tuple[str, ...]
    cpp_files: tuple[Path, ...] = ()
    cuda_files: tuple[Path, ...] = ()
    cpp_wrappers: tuple[Wrapper, ...] = ()
    cuda_wrappers: tuple[Wrapper, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    cuda_flags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()
    include_paths: tuple[Path, ...] = ()
    cuda_archs: tuple[CudaArch, ...] = ()

    def __post_init__(self) -> None:
        check_module_name(self.name)
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {self.device!r}")
        for path in (*self.cpp_files, *self.cuda_files):
            check_includable(path)
        exports = [w.export_name for w in (*self.cpp_wrappers, *self.cuda_wrappers)]
        if not exports:
            raise ValueError(
                f"module {self.name!r} exports nothing: give cpp_wrappers or cuda_wrappers"
            )
        duplicates = sorted({e for e in exports if exports.count(e) > 1})
        if duplicates:
            raise ValueError(f"module {self.name!r} exports {duplicates} more than once")

    @property
    def exports(self) -> tuple[str, ...]:
        return tuple(w.export_name for w in (*self.cpp_wrappers, *self.cuda_wrappers))

    def translation_units(self) -> dict[str, str]:
        """Generated source file name -> text: ``main.cpp`` and/or ``main.cu``."""
        units = {}
        if self.cpp_files or self.cpp_wrappers:
            units["main.cpp"] = self._render(self.cpp_files, self.cpp_wrappers)
        if self.cuda_files or self.cuda_wrappers:
            units["main.cu"] = self._render(self.cuda_files, self.cuda_wrappers)
        return units

    def _render(self, files: tuple[Path, ...], wrappers: tuple[Wrapper, ...]) -> str:
        args = ", ".join(self.template_args)
        lines = [
            f"// Generated by mllm_kernel for module '{self.name}' <{args}>. Do not edit.",
            "#include <tvm/ffi/function.h>",
            '#include "mllm_kernel/utils.hpp"  // the dtype aliases template arguments use',
            *(f'#include "{path}"' for path in files),
            *(w.render() for w in wrappers),
        ]
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        return f"{self.name}<{', '.join(self.template_args)}> ({self.device})"


def stable_hash(material: dict) -> str:
    text = json.dumps(material, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()
