"""Which kernels exist: the package's own (registered at import, before any call)
and users' (recorded when loaded), with their variants and cache status.

A kernel is registered with a *spec function*: a plain function from a variant to
its BuildSpec, which builds nothing. show-config and precompile call it, so they name
cache directories exactly as the loader does. Modules declared with
:class:`~mllm_kernel.jit_utils.kernel_module.KernelModule` register their own
``spec`` method; a hand-written builder (a ``cache_once`` function that calls
load_cpu_jit / load_cuda_jit, registered with :func:`register_kernel`) is read by
:func:`builder_spec`, which runs it while the loader hands back specs instead of
modules.
"""

from __future__ import annotations

import contextvars
import difflib
import importlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mllm_kernel.jit_utils.cuda_arch import EVERY_ARCH, ArchSupport
from mllm_kernel.jit_utils.spec import DEVICES, BuildSpec

BUILTIN_OP_MODULES = ("mllm_kernel.cpu.jit", "mllm_kernel.cuda.jit")

# While builder_spec runs a hand-written builder: the specs the loader was asked for.
_captured: contextvars.ContextVar[list[BuildSpec] | None] = contextvars.ContextVar(
    "mllm_kernel_captured_specs", default=None
)

SpecFunction = Callable[..., BuildSpec]


@dataclass
class KernelEntry:
    """A kernel: how to describe (and build) it, and the argument tuples (variants) it is
    built with. ``builder`` is None for a user module only seen loaded. ``op``: the
    public op a helper module serves, when its name is not the op's (precompile's
    ``--kernel OP`` builds it with the op's own). ``archs``: the CUDA archs its kernels
    run on (precompile skips the others)."""

    name: str
    device: str
    builder: Callable[..., Any] | None
    variants: list[tuple[Any, ...]] = field(default_factory=list)
    builtin: bool = True
    loaded: set[tuple[str, ...]] = field(default_factory=set)
    spec_function: SpecFunction | None = None
    op: str | None = None
    archs: ArchSupport = EVERY_ARCH

    def spec(self, variant: tuple[Any, ...]) -> BuildSpec:
        """The BuildSpec of ``variant`` (no compiler runs)."""
        if self.spec_function is not None:
            return self.spec_function(*variant)
        if self.builder is None:
            raise ValueError(f"kernel {self.name!r} has no registered builder")
        return builder_spec(self.builder, *variant)


_entries: dict[tuple[str, str], KernelEntry] = {}
_lock = threading.Lock()


def register_kernel(
    name: str,
    *,
    device: str,
    variants: Iterable[tuple[Any, ...]] = (),
    builtin: bool = True,
    spec_function: SpecFunction | None = None,
    op: str | None = None,
    archs: ArchSupport = EVERY_ARCH,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Registers a module builder so tools see it before its first call.

    ``variants`` are the argument tuples the builder is called with (all of
    them, where the set is finite); ``builtin=False`` marks a user's kernel
    (show-config labels it so); ``spec_function(*variant)`` returns a variant's
    BuildSpec without building (default: :func:`builder_spec`); ``op`` names the public
    op a helper module (another name) serves; ``archs`` the CUDA archs its kernels run
    on (:class:`~mllm_kernel.jit_utils.cuda_arch.ArchSupport`). A module declared as a
    :class:`~mllm_kernel.jit_utils.kernel_module.KernelModule` registers itself; this
    is for hand-written builders::

        @register_kernel("add_constant", device="cpu", variants=[(c,) for c in (1, 2, 4)])
        @cache_once
        def _add_constant_module(c: int):
            ...
    """
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")

    def decorate(builder: Callable[..., Any]) -> Callable[..., Any]:
        with _lock:
            entry = _entries.get((name, device))
            if entry is None:
                _entries[(name, device)] = KernelEntry(
                    name, device, builder, list(variants), builtin,
                    spec_function=spec_function, op=op, archs=archs,
                )  # fmt: skip
            else:  # a user kernel first seen at load time, registered afterwards
                entry.builder, entry.variants, entry.builtin = builder, list(variants), builtin
                entry.spec_function, entry.op, entry.archs = spec_function, op, archs
        return builder

    return decorate


def unknown_names(unknown: Iterable[str], known: Iterable[str]) -> str:
    """``"'rmsnrom' (did you mean 'rmsnorm'?), 'x'"``: the names a user gave that are
    not kernels, each with the closest known name where one is close.

    >>> unknown_names(["rmsnrom"], ["rmsnorm", "softmax"])
    "'rmsnrom' (did you mean 'rmsnorm'?)"
    """
    known = list(known)
    guesses = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1)
        guesses.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    return ", ".join(guesses)


def find(name: str, device: str) -> KernelEntry | None:
    """The registered kernel ``name`` on ``device``, or None."""
    with _lock:
        return _entries.get((name, device))


def unregister(name: str, device: str) -> None:
    """Forgets a kernel (a no-op if it is not registered)."""
    with _lock:
        _entries.pop((name, device), None)


# ---------------------------------------------------------------- the original's view
# The original mllm-kernel keeps one metadata dict per @jit kernel, keyed by its "key";
# these three functions are its API. The kernels themselves live in _entries above
# (the decorator registers them there too, which is what show-config and precompile read);
# here is only the metadata, and which entries each key added, so clearing forgets them.
_jit_infos: dict[str, dict[str, Any]] = {}
_jit_entries: dict[str, tuple[tuple[str, str], ...]] = {}


def register_jit_kernel(info: dict[str, Any], *, entries: Iterable[tuple[str, str]] = ()) -> None:
    """Records one @jit kernel's metadata under ``info["key"]`` (the original
    mllm-kernel's function). ``entries``: the ``(name, device)`` kernels registered
    with :func:`register_kernel` for it, forgotten by :func:`clear_jit_kernel_registry`.

    >>> register_jit_kernel({"key": "my_mod.f|export=f", "export_name": "f"})  # doctest: +SKIP
    """
    if not isinstance(info, dict) or "key" not in info:
        raise TypeError(
            f"register_jit_kernel: expected a dict with a 'key' entry, got {info!r:.200}"
        )
    key = str(info["key"])
    with _lock:
        _jit_infos[key] = dict(info)
        _jit_entries[key] = (*_jit_entries.get(key, ()), *entries)


def get_jit_kernel_registry() -> dict[str, dict[str, Any]]:
    """Every recorded @jit kernel's metadata, by key (copies: changing them changes nothing).

    >>> isinstance(get_jit_kernel_registry(), dict)
    True
    """
    with _lock:
        return {key: dict(info) for key, info in _jit_infos.items()}


def clear_jit_kernel_registry() -> None:
    """Forgets every @jit kernel's metadata and its kernels in show-config and precompile.

    The decorated functions keep working; the package's own kernels stay registered.
    """
    with _lock:
        for added in _jit_entries.values():
            for name_device in added:
                _entries.pop(name_device, None)
        _jit_infos.clear()
        _jit_entries.clear()


def builder_spec(builder: Callable[..., Any], *args: Any) -> BuildSpec:
    """The BuildSpec that ``builder(*args)`` (a hand-written builder calling
    load_cpu_jit / load_cuda_jit) would load; nothing is built or loaded.

    The builder runs (uncached, if it is a ``cache_once`` function) while the loader
    returns each spec instead of loading it; the first spec asked for is the answer.
    """
    target = getattr(builder, "uncached", builder)
    specs: list[BuildSpec] = []
    token = _captured.set(specs)
    try:
        target(*args)
    except Exception:
        if not specs:  # a builder that uses the module it got fails after the spec
            raise
    finally:
        _captured.reset(token)
    if not specs:
        raise RuntimeError(f"{builder.__qualname__} did not call load_cpu_jit/load_cuda_jit")
    return specs[0]


def capture(spec: BuildSpec) -> bool:
    """Called by the loader with each finished spec: True (the loader then returns the
    spec, building nothing) while :func:`builder_spec` runs a builder."""
    specs = _captured.get()
    if specs is None:
        return False
    specs.append(spec)
    return True


def record_loaded(spec: BuildSpec) -> None:
    """Remembers a loaded module, so user kernels appear in the registry too."""
    with _lock:
        entry = _entries.get((spec.name, spec.device))
        if entry is None:
            entry = _entries[(spec.name, spec.device)] = KernelEntry(
                spec.name, spec.device, builder=None, builtin=False
            )
        entry.loaded.add(spec.template_args)


def load_builtin_kernels() -> None:
    """Imports the package's op modules, which register their kernels."""
    for module in BUILTIN_OP_MODULES:
        importlib.import_module(module)


def kernels(device: str | None = None, *, include_builtin: bool = True) -> list[KernelEntry]:
    """Registered kernels (importing the built-in ones first), sorted by device and name."""
    if include_builtin:
        load_builtin_kernels()
    with _lock:
        found = [e for e in _entries.values() if device in (None, e.device)]
    return sorted(found, key=lambda e: (e.device, e.name))


@dataclass(frozen=True)
class VariantStatus:
    """One variant's cache state: ``cached``, ``not built``, ``stale``, ``corrupt`` or
    ``unknown`` (its key cannot be computed here: ``detail`` says why)."""

    kernel: str
    device: str
    template_args: tuple[str, ...]
    status: str
    path: Path | None = None
    size_bytes: int | None = None
    detail: str = ""


def variant_status(entry: KernelEntry, variant: tuple[Any, ...]) -> VariantStatus:
    from mllm_kernel.jit_utils import cache
    from mllm_kernel.jit_utils.cache_key import module_key
    from mllm_kernel.jit_utils.status import variant_state

    try:
        spec = entry.spec(variant)
        key = module_key(spec)
    except Exception as exc:  # no toolchain, no arch, sources not installed: say so
        return VariantStatus(
            entry.name,
            entry.device,
            tuple(map(str, variant)),
            "unknown",
            detail=str(exc).splitlines()[0],
        )
    found = cache.lookup(key)
    status = variant_state(found.status)
    size = found.artifact.stat().st_size if found.artifact else None
    return VariantStatus(
        entry.name, entry.device, spec.template_args, status, key.path, size, found.reason
    )
