"""Packing a prebuilt cache into a wheel that, once installed, is found by itself.

``precompile --output DIR --wheel`` calls :func:`pack`: the wheel
``mllm_kernel_cache_<tag>-<version>-py3-none-<platform>.whl`` holds the package
``mllm_kernel_cache_<tag>`` with DIR's entries under ``cache/``: installed anywhere
on ``sys.path``, it is where :func:`.prebuilt.read_only_caches` looks. ``<tag>``
names the CUDA archs the cache holds (``sm90a``, ``sm90a-sm100a``), or ``cpu`` when
it holds only CPU builds.

The wheel requires the mllm-kernel and apache-tvm-ffi versions it was built with:
an entry is only ever found by a key that holds both, so with any other version it
would be dead weight. Its platform tag is the building machine's (CPU builds are
made for that machine's ISA, which their key holds too).

>>> pack(Path("prebuilt"), Path("dist"))  # doctest: +SKIP
PosixPath('dist/mllm_kernel_cache_sm90a-0.1.0-py3-none-linux_x86_64.whl')
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import stat
import sysconfig
import zipfile
from pathlib import Path

import tvm_ffi

from mllm_kernel import __version__
from mllm_kernel.jit_utils import build_inputs, cache
from mllm_kernel.jit_utils.cuda_arch import parse_arch_list
from mllm_kernel.jit_utils.logging_setup import get_logger
from mllm_kernel.jit_utils.prebuilt import CACHE_PACKAGE_PREFIX, CACHE_SUBDIR

# Fixed timestamps and modes: the same cache packs into the same bytes.
_ZIP_TIME = (1980, 1, 1, 0, 0, 0)
_FILE_ATTR = (stat.S_IFREG | 0o644) << 16

_PACKAGE_INIT = '''"""A prebuilt mllm-kernel cache ({tag}).

Made by ``python -m mllm_kernel precompile --wheel``. mllm-kernel finds this
package by its name on ``sys.path`` and loads the kernels in ``CACHE_DIR``
without compiling; nothing needs to import it.
"""

from pathlib import Path

CACHE_DIR = Path(__file__).parent / "{subdir}"
'''


def cache_entries(cache_dir: Path) -> list[Path]:
    """The current entry directories of the prebuilt cache ``cache_dir``: those with a
    manifest whose sources are the package's and the user's files as they are now. A
    stale entry (a source changed since it was built: a load would refuse it and build
    instead) is left out with a WARNING; FileNotFoundError when none is left."""
    entries = []
    for path in sorted(cache_dir.iterdir()):
        if path.name.startswith(".") or not path.is_dir() or path.is_symlink():
            continue
        if not (path / cache.MANIFEST).is_file():
            continue
        try:  # as a prebuilt lookup checks it: sources only, no toolchain here
            reason = build_inputs.check(cache.Manifest.read(path).inputs(), toolchain=False).reason
        except (OSError, ValueError, TypeError) as exc:
            reason = f"no readable manifest ({exc})"
        if reason is None:
            entries.append(path)
        else:
            get_logger().warning("not packed: %s is stale (%s); precompile it again", path, reason)
    if not entries:
        raise FileNotFoundError(
            f"{cache_dir} holds no current cache entries to pack; fill it with "
            "`python -m mllm_kernel precompile --output DIR` first"
        )
    return entries


def cache_tag(entries: list[Path]) -> str:
    """``sm90a``, ``sm90a-sm100a``: the CUDA archs of ``entries``, or ``cpu`` for none."""
    archs = {
        arch
        for entry in entries
        for text in cache.Manifest.read(entry).cuda_archs
        for arch in parse_arch_list(text)
    }
    return "-".join(f"sm{arch.number}" for arch in sorted(archs)) or "cpu"


def platform_tag() -> str:
    """This machine's wheel platform tag, e.g. ``linux_x86_64``."""
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


def _metadata(dist_name: str, tag: str) -> str:
    return (
        "Metadata-Version: 2.1\n"
        f"Name: {dist_name}\n"
        f"Version: {__version__}\n"
        f"Summary: Prebuilt mllm-kernel kernels ({tag}), loaded without a compiler\n"
        f"Requires-Dist: mllm-kernel=={__version__}\n"
        f"Requires-Dist: apache-tvm-ffi=={tvm_ffi.__version__}\n"
    )


def _wheel_file(platform: str) -> str:
    return (
        "Wheel-Version: 1.0\n"
        f"Generator: mllm_kernel {__version__}\n"
        "Root-Is-Purelib: false\n"
        f"Tag: py3-none-{platform}\n"
    )


def pack(cache_dir: Path, wheel_dir: Path) -> Path:
    """Writes the wheel of the prebuilt cache ``cache_dir`` into ``wheel_dir`` (created if
    missing) and returns its path. An older wheel of the same name is replaced."""
    entries = cache_entries(cache_dir)
    tag = cache_tag(entries)
    module = CACHE_PACKAGE_PREFIX + tag.replace("-", "_")
    dist_name = module.replace("_", "-")
    platform = platform_tag()
    dist_info = f"{module}-{__version__}.dist-info"
    files: list[tuple[str, bytes]] = [
        (
            f"{module}/__init__.py",
            _PACKAGE_INIT.format(tag=tag, subdir=CACHE_SUBDIR).encode(),
        )
    ]
    for entry in entries:
        for item in sorted(entry.iterdir()):
            if stat.S_ISREG(item.lstat().st_mode):
                files.append(
                    (f"{module}/{CACHE_SUBDIR}/{entry.name}/{item.name}", item.read_bytes())
                )
    files += [
        (f"{dist_info}/METADATA", _metadata(dist_name, tag).encode()),
        (f"{dist_info}/WHEEL", _wheel_file(platform).encode()),
    ]
    record = "".join(f"{name},{_record_hash(data)},{len(data)}\n" for name, data in files)
    files.append((f"{dist_info}/RECORD", f"{record}{dist_info}/RECORD,,\n".encode()))

    wheel_dir.mkdir(parents=True, exist_ok=True)
    wheel = wheel_dir / f"{module}-{__version__}-py3-none-{platform}.whl"
    partial = wheel.with_name(f".{wheel.name}.{os.getpid()}.partial")
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in files:
                info = zipfile.ZipInfo(name, date_time=_ZIP_TIME)
                info.external_attr = _FILE_ATTR
                info.compress_type = zipfile.ZIP_DEFLATED
                archive.writestr(info, data)
        os.replace(partial, wheel)
    finally:
        partial.unlink(missing_ok=True)
    return wheel
