"""Compiling and linking one module in a staging directory, and explaining failures.

A failure leads with the first compiler error as ``file:line: message``; one on a line
of the generated unit (deleted with the staging directory) leads with what that line
is instead: the user's wrapper expression and export name, where the function it names
is declared, and a hint (:func:`generated_line_error`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from mllm_kernel.jit_utils import build_inputs, env, include_search, paths, toolchain, trust
from mllm_kernel.jit_utils.cpp_declarations import find_declarations, function_name
from mllm_kernel.jit_utils.cuda_arch import gencode_flags
from mllm_kernel.jit_utils.errors import KernelBuildError
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.spec import BuildSpec, Wrapper

_logger = get_logger()

# gcc/clang: "file:12:5: error: msg"; nvcc: "file(12): error: msg".
_GCC_ERROR = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:\d+:)?\s*(?:fatal )?error:\s*(?P<msg>.*)$"
)
_NVCC_ERROR = re.compile(
    r"^(?P<file>\S[^(]*)\((?P<line>\d+)\):\s*(?:catastrophic )?error:?\s*(?P<msg>.*)$"
)
_ANY_ERROR = re.compile(r"(?i)\berror\b|undefined reference|cannot find -l|nvcc fatal")
# A full, read-only or forbidden filesystem: the tools report it in passing and then
# fail with a generic line (collect2's "ld returned 1 exit status"), so it is looked
# for first. strerror text -> errno name.
_FILESYSTEM_ERRORS = {
    "No space left on device": "ENOSPC",
    "Read-only file system": "EROFS",
    "Permission denied": "EACCES",
}
_FILESYSTEM_ERROR = re.compile("|".join(map(re.escape, _FILESYSTEM_ERRORS)))
_FILESYSTEM_ERRNOS = {errno.ENOSPC: "ENOSPC", errno.EROFS: "EROFS", errno.EACCES: "EACCES"}
_FILESYSTEM_HINT = (
    "free space or fix the permissions there, or point MLLM_KERNEL_CACHE_DIR at a "
    "writable filesystem"
)
_ABSOLUTE_PATH = re.compile(r"(/[^\s:'\"]+)")
_TOOL_PREFIX = re.compile(r"^\S+?: ")  # "/usr/bin/ld: ", "cc1plus: "

_HINTS = (
    (
        re.compile(r"No such file or directory|cannot open source file|file not found"),
        "a header or source is missing: check the #include, and add its directory with "
        "extra_include_paths=[...]",
    ),
    (
        re.compile(r"cannot find -lcudart|libcudart"),
        "libcudart was not found: point CUDA_HOME at a toolkit whose lib64/ or lib/ "
        "has libcudart.so",
    ),
    (
        re.compile(
            r"(?i)unsupported gpu architecture|invalid value for --gpu-architecture|"
            r"is not defined for option 'gpu-architecture'"
        ),
        "this nvcc does not support the requested arch: set MLLM_KERNEL_CUDA_ARCH_LIST to one it "
        "supports (nvcc --list-gpu-arch)",
    ),
    (
        re.compile(r"nvcc: not found|nvcc: No such file"),
        "nvcc is missing: install the CUDA toolkit or set CUDA_HOME",
    ),
    (
        re.compile(r"undefined reference"),
        "a symbol is declared but not defined: is a source file missing from cpp_files/cuda_files?",
    ),
)


@dataclass
class BuildResult:
    artifact: Path
    inputs: build_inputs.BuildInputs  # what the compilers read
    seconds: float
    toolchain: dict[str, str]


def _compile_command(spec: BuildSpec, unit: Path, obj: Path, depfile: Path) -> list[str]:
    includes = [f"-I{paths.include_dir()}", *(f"-I{p}" for p in spec.include_paths)]
    for path in paths.tvm_ffi_include_dirs():
        includes += ["-isystem", str(path)]  # nvcc rejects the joined -isystem<path> form
    cxx = str(toolchain.find_cxx().path)
    # Both compilers: every header opened, system ones included (-MD, not -MMD: a header
    # reached through -isystem must be recorded too), to `depfile`; one object out.
    common = [*includes, "-MD", "-MF", str(depfile), "-c", str(unit), "-o", str(obj)]
    if unit.suffix == ".cu":
        nvcc = str(toolchain.find_cuda().nvcc.path)
        return [nvcc, "-ccbin", cxx, *spec.cuda_flags, *gencode_flags(spec.cuda_archs), *common]
    return [cxx, *spec.cxx_flags, *common]


def _link_command(spec: BuildSpec, objects: list[Path], artifact: Path) -> list[str]:
    tvm_lib = paths.tvm_ffi_library()
    command = [
        str(toolchain.find_cxx().path),
        "-shared",
        "-o",
        str(artifact),
        *map(str, objects),
        f"-L{tvm_lib.parent}",
        "-ltvm_ffi",
        f"-Wl,-rpath,{tvm_lib.parent}",
    ]
    if spec.device == "cuda":
        lib_dir = toolchain.find_cuda().lib_dir
        command += [f"-L{lib_dir}", "-lcudart", f"-Wl,-rpath,{lib_dir}"]
    return command + list(spec.ldflags)


def parse_depfile(text: str) -> list[str]:
    r"""The prerequisites of a make-style depfile (``-MMD`` output): gcc and nvcc write a
    space in a path as ``\ ``, a ``#`` as ``\#`` and a ``$`` as ``$$``.

    >>> parse_depfile("m.o: /a\\ b/x.h /c\\#d/y$$z.h \\\n /e.h\n")
    ['/a b/x.h', '/c#d/y$z.h', '/e.h']
    """
    body = text.replace("\\\n", " ")
    deps: list[str] = []
    for rule in body.splitlines():
        if ":" not in rule:
            continue
        _, _, prerequisites = rule.partition(": ")
        # Escaped spaces belong to the path; unescaped ones separate paths.
        for token in re.split(r"(?<!\\)\s+", prerequisites.strip()):
            if token:
                deps.append(re.sub(r"\\([ #])", r"\1", token).replace("$$", "$"))
    return deps


def _first_located_error(log: str) -> tuple[str, int, str] | None:
    """``(file, line, message)`` of the first compiler error in ``log`` that names a
    place, or None."""
    for line in log.splitlines():
        for pattern in (_GCC_ERROR, _NVCC_ERROR):
            match = pattern.match(line.strip())
            if match:
                return match["file"], int(match["line"]), match["msg"].strip()
    return None


def first_error(log: str) -> str:
    """The first compiler/linker error in ``log`` as ``file:line: message``."""
    located = _first_located_error(log)
    if located is not None:
        return f"{located[0]}:{located[1]}: {located[2]}"
    lines = log.splitlines()
    for line in lines:
        if _ANY_ERROR.search(line):
            return line.strip()
    return lines[-1].strip() if lines else "unknown error (empty compiler output)"


def filesystem_error(log: str, workdir: Path) -> str | None:
    """``"<strerror> (<ERRNO>): <path>"`` when the tools failed on the filesystem.

    The path is the one the failing line names, else ``workdir`` (where every
    output of the build is written).
    """
    for line in log.splitlines():
        match = _FILESYSTEM_ERROR.search(line)
        if match:
            named = _ABSOLUTE_PATH.findall(_TOOL_PREFIX.sub("", line[: match.start()], count=1))
            path = named[-1] if named else str(workdir)
            return f"{match[0]} ({_FILESYSTEM_ERRORS[match[0]]}): {path}"
    return None


def hint_for(log: str) -> str | None:
    for pattern, hint in _HINTS:
        if pattern.search(log):
            return hint
    return None


# Each compiler runs in a process group of its own under this shell, which kills the
# group when told (SIGTERM): on Linux the kernel tells it when the builder dies, SIGKILL
# included (PR_SET_PDEATHSIG). The group, because cc1plus, cicc and ptxas are children
# of the driver: killing the driver alone would leave them running.
_GROUP_GUARD = 'trap "kill -KILL 0" TERM; "$@" & wait $!'
_PR_SET_PDEATHSIG = 1


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before any fork (a forked child should only call it)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _start(command: list[str], cwd: Path, output: IO[bytes]) -> subprocess.Popen:
    prctl, builder, sigterm = _prctl(), os.getpid(), int(signal.SIGTERM)
    if prctl is None:
        preexec = None
    else:
        command = ["/bin/sh", "-c", _GROUP_GUARD, "sh", *command]

        def preexec() -> None:  # in the child, between fork and exec: keep it to syscalls
            prctl(_PR_SET_PDEATHSIG, sigterm, 0, 0, 0)
            if os.getppid() != builder:  # it died before the line above took effect
                os._exit(1)

    return subprocess.Popen(
        command,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=preexec,
    )


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_compilers(commands: list[list[str]], cwd: Path) -> list[tuple[int, str]]:
    """Runs ``commands`` side by side in ``cwd``: ``(exit status, output)`` of each.

    They die with the calling process: killed when this call is interrupted (Ctrl-C or
    any exception), and on Linux when the process is killed outright (see
    ``_GROUP_GUARD``), so no orphaned compiler keeps a core busy.
    """
    started: list[tuple[subprocess.Popen, IO[bytes]]] = []
    with contextlib.ExitStack() as outputs:
        try:
            for command in commands:
                # Output goes to unnamed files in cwd: parallel compilers never block on a
                # full pipe, and nothing is left behind in the directory.
                output = outputs.enter_context(tempfile.TemporaryFile(dir=cwd))
                started.append((_start(command, cwd, output), output))
            results = []
            for proc, output in started:
                code = proc.wait()
                output.seek(0)
                results.append((code, output.read().decode(errors="replace")))
            return results
        finally:
            for proc, _ in started:
                if proc.poll() is None:
                    _kill_group(proc)


def _log_commands(commands: list[list[str]]) -> None:
    if env.verbose():
        for command in commands:
            _logger.info("$ %s", shlex.join(command))


def build(spec: BuildSpec, staging: Path, log_path: Path) -> BuildResult:
    """Compiles and links ``spec`` inside ``staging``; raises KernelBuildError on failure."""
    started, started_ns = time.monotonic(), time.time_ns()
    units = []
    for filename, text in spec.translation_units().items():
        unit = staging / filename
        unit.write_text(text)
        units.append(unit)
    jobs = [(u, staging / f"{u.name}.o", staging / f"{u.name}.d") for u in units]
    commands = [_compile_command(spec, u, o, d) for u, o, d in jobs]
    _log_commands(commands)
    outcomes = run_compilers(commands, staging)
    log = "".join(
        f"$ {shlex.join(c)}\n{out}\n" for c, (_, out) in zip(commands, outcomes, strict=False)
    )
    failed = any(code != 0 for code, _ in outcomes)
    artifact = staging / f"{spec.name}.so"
    if not failed:
        link = _link_command(spec, [o for _, o, _ in jobs], artifact)
        _log_commands([link])
        ((code, out),) = run_compilers([link], staging)
        log += f"$ {shlex.join(link)}\n{out}\n"
        failed = code != 0
    if failed:
        raise _build_error(spec, log, log_path, staging)

    inputs = _record_inputs(spec, staging, jobs, started_ns)
    inputs.deps.update(_link_inputs(spec))
    for _, obj, depfile in jobs:  # only the .so and the generated sources are kept
        obj.unlink()
        depfile.unlink()
    # Named by its content: a process keeps every library it loaded, and the dynamic
    # loader hands back the one already loaded from a path, so a rebuilt module under
    # its predecessor's name would load as the predecessor in a process that had it.
    named = staging / f"{spec.name}.{build_inputs.file_digest(artifact)[:16]}.so"
    artifact = artifact.rename(named)
    tools = {"cxx": toolchain.find_cxx().version()}
    if spec.device == "cuda":
        tools["nvcc"] = toolchain.find_cuda().nvcc_version().text
    return BuildResult(artifact, inputs, time.monotonic() - started, tools)


def _link_inputs(spec: BuildSpec) -> dict[str, str]:
    """The files the link step takes from ``spec.ldflags`` that a later change would
    build into another binary, path -> sha256: objects and archives given by absolute
    path, and the static archives of ``-lname`` (``-l:file``) found in ``-Ldir``
    directories with no shared library of that name before them (a shared one is read
    when the module loads, not built in)."""
    flags = list(spec.ldflags)
    dirs = [f[2:] for f in flags if f.startswith("-L") and len(f) > 2]
    found: list[str] = []
    for flag in flags:
        if flag.startswith("-l") and len(flag) > 2:
            name = flag[2:]
            candidates = [name[1:]] if name.startswith(":") else [f"lib{name}.so", f"lib{name}.a"]
            for directory in dirs:
                hits = [os.path.join(directory, c) for c in candidates]
                hit = next((h for h in hits if os.path.isfile(h)), None)
                if hit is not None:
                    if hit.endswith(".a"):
                        found.append(hit)
                    break
        elif os.path.isabs(flag) and flag.endswith((".a", ".o")) and os.path.isfile(flag):
            found.append(flag)
    return {path: build_inputs.file_digest(path) for path in found}


def _record_inputs(
    spec: BuildSpec, staging: Path, jobs: list[tuple[Path, Path, Path]], started_ns: int
) -> build_inputs.BuildInputs:
    """What the manifest keeps of the compilers' dependency output (see
    :mod:`.build_inputs`): the files each compiler opened, by the paths it opened them
    under, each unit's search path, and the generated unit's own directives; a file
    written since ``started_ns`` as changed (the next lookup builds again)."""
    units = []
    generated = os.path.normpath(staging)
    for unit, _, depfile in jobs:
        # Joined to the directory the compiler ran in, never resolved (see build_inputs);
        # the generated units live (briefly) in staging, and the key covers their text.
        opened = [os.path.join(staging, dep) for dep in parse_depfile(depfile.read_text())]
        opened = [p for p in opened if os.path.dirname(os.path.normpath(p)) != generated]
        dirs = include_search.search_path(spec, unit)
        units.append(build_inputs.CompiledUnit(opened, dirs, unit.read_bytes()))
    return build_inputs.record(units, include_search.toolchain_dirs(spec), started_ns=started_ns)


def cache_write_error(spec: BuildSpec, exc: OSError) -> KernelBuildError | None:
    """The build error for ``exc`` when the cache itself could not be written (a full,
    read-only or forbidden filesystem while locking, staging or installing, or a path
    the trust rule refuses), else None."""
    name = _FILESYSTEM_ERRNOS.get(exc.errno)
    if name is None:
        return None
    if isinstance(exc, trust.UntrustedPath):  # its text already says what is wrong and the fix
        error, hint = str(exc), None
    else:
        error, hint = f"{exc.strerror} ({name}): {exc.filename}", _FILESYSTEM_HINT
    args = ", ".join(spec.template_args)
    return KernelBuildError(
        f"{error}\n"
        f"  while building module {spec.name!r} with template args <{args}> ({spec.device})"
        + (f"\n  hint: {hint}" if hint else ""),
        module=spec.name,
        template_args=spec.template_args,
        first_error=error,
        log_path="",
        hint=hint,
    )


@dataclass(frozen=True)
class GeneratedLineError:
    """A compiler error on a line of the generated ``main.cpp`` / ``main.cu`` (which is
    deleted with its staging directory): what that line is, in the user's terms.

    ``lead`` replaces ``file:line: message`` at the head of the error; ``context`` are
    lines to add under it (where the wrapped function is declared); ``hint`` is set for
    a wrapper line.
    """

    lead: str
    context: tuple[str, ...] = ()
    hint: str | None = None


_WRAPPER_HINT = (
    "the wrapper's expression must name a function of the sources with template arguments "
    "that fit its template parameters: make_cpp_args(3) gives the value 3 (for an int "
    "parameter), make_cpp_args(torch.float32) the type fp32_t (for a typename parameter)"
)


def _wrapper_context(spec: BuildSpec, unit: str, wrapper: Wrapper) -> tuple[str, ...]:
    """Where the function ``wrapper`` names is declared in the unit's sources, if found."""
    name = function_name(wrapper.expression)
    if name is None:
        return ()
    files = spec.cuda_files if unit.endswith(".cu") else spec.cpp_files
    found = find_declarations(name, files, spec.include_paths)
    if not found:
        sources = ", ".join(str(f) for f in files) or "no source files"
        return (f"no declaration of {name!r} was found in {sources}",)
    return tuple(f"{name} is declared at {d.where()}: {d.text}" for d in found[:3])


def generated_line_error(spec: BuildSpec, log: str, workdir: Path) -> GeneratedLineError | None:
    """The first error of ``log`` explained in the user's terms when it is on a line of a
    unit generated in ``workdir``; None when it is elsewhere (the user's sources, a
    header: those files exist and their ``file:line`` leads as it is)."""
    located = _first_located_error(log)
    if located is None:
        return None
    file, line, message = located
    units = spec.translation_units()
    unit = Path(file).name
    if unit not in units or Path(file).parent.resolve() != workdir.resolve():
        return None
    lines = units[unit].splitlines()
    text = lines[line - 1].strip() if 0 < line <= len(lines) else ""
    wrappers = spec.cuda_wrappers if unit.endswith(".cu") else spec.cpp_wrappers
    for wrapper in wrappers:
        if wrapper.render() == text:
            what = "cuda_wrappers" if unit.endswith(".cu") else "cpp_wrappers"
            return GeneratedLineError(
                f"wrapper {wrapper.export_name!r} = {wrapper.expression} ({what}) does not "
                f"compile: {message}",
                _wrapper_context(spec, unit, wrapper),
                _WRAPPER_HINT,
            )
    return GeneratedLineError(f"line {line} of the generated {unit} ({text}): {message}")


def _build_error(spec: BuildSpec, log: str, log_path: Path, workdir: Path) -> KernelBuildError:
    context: tuple[str, ...] = ()
    error = filesystem_error(log, workdir)
    generated = None if error is not None else generated_line_error(spec, log, workdir)
    if error is not None:
        hint = _FILESYSTEM_HINT
    elif generated is not None:
        error, context, hint = generated.lead, generated.context, generated.hint
    else:
        error, hint = first_error(log), hint_for(log)
    # The generated units go with their staging directory; the log keeps their text.
    generated_units = "".join(
        f"--- generated {name} (line numbers as in the errors above) ---\n{text}"
        for name, text in spec.translation_units().items()
    )
    try:
        log_path.write_text(f"{log}{generated_units}")
        where_logged = str(log_path)
    except OSError as exc:  # the same full or read-only disk, typically
        where_logged = f"not written ({exc.strerror}: {log_path}); its end:\n{log[-2000:]}"
    args = ", ".join(spec.template_args)
    message = "\n".join(
        [
            error,
            *(f"  {line}" for line in context),
            f"  while building module {spec.name!r} with template args <{args}> ({spec.device})",
            f"  full log: {where_logged}",
        ]
    )
    if hint:
        message += f"\n  hint: {hint}"
    return KernelBuildError(
        message,
        module=spec.name,
        template_args=spec.template_args,
        first_error=error,
        log_path=str(log_path),
        hint=hint,
    )
