"""Prebuilt read-only caches (issue 18, point 2): ``precompile --output`` writes one, and
a process given it in MLLM_KERNEL_CACHE_PATH loads every built-in CPU op from it
without a compiler, without writing there, and only under the read-only trust rule."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest
import tvm_ffi
from conftest import CHILD_PYTHONPATH, OK_SOURCE, PACKAGE_PARENT

import mllm_kernel
from mllm_kernel.jit_utils import (
    cache,
    cache_wheel,
    env,
    load_cpu_jit,
    paths,
    prebuilt,
    precompile,
    registry,
)
from mllm_kernel.jit_utils.cache_key import module_key, relocatable_key, relocatable_key_material
from mllm_kernel.jit_utils.loader import cpu_spec
from mllm_kernel.jit_utils.spec import BuildSpec

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")


@pytest.fixture(autouse=True)
def _forget_user_kernels():
    """The registry remembers every module loaded in this process; show-config tests that
    run later must not see this file's "ok" kernel."""
    yield
    registry.unregister("ok", "cpu")


@pytest.fixture(scope="module")
def cpu_prebuilt(tmp_path_factory) -> Path:
    """Every built-in CPU kernel variant, precompiled into a prebuilt cache."""
    output = tmp_path_factory.mktemp("prebuilt") / "cache"
    report = precompile.precompile(device="cpu", output=output)
    assert report.results and not report.failures, report.failures
    return output


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` with its size, mtime and mode: what a write would change."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in (*dirnames, *filenames))]:
            info = os.lstat(name)
            found[name] = (info.st_size, info.st_mtime_ns, info.st_mode)
    return found


# The start of every no-toolchain child: once torch is imported (its import may start
# processes of its own), any attempt to start a process fails the run.
REFUSE_PROCESSES = textwrap.dedent("""
    import os, subprocess
    import torch

    def refuse(*args, **kwargs):
        raise AssertionError(f"tried to start a process: {args[:1]}")

    subprocess.Popen.__init__ = refuse
    os.posix_spawn = os.posix_spawnp = os.system = os.execv = os.execve = os.fork = refuse
""")

# Runs in a child whose PATH holds no compiler and whose CUDA_HOME is unset; any
# attempt to start a process fails the run.
NO_TOOLCHAIN_PROBE = REFUSE_PROCESSES + textwrap.dedent("""
    import sys

    from mllm_kernel.cpu import jit as cpu
    from mllm_kernel.jit_utils import registry

    loaded = 0
    for entry in registry.kernels("cpu"):
        for variant in entry.variants:
            module = entry.builder(*variant)
            for export in entry.spec(variant).exports:
                module.get_function(export)
            loaded += 1

    torch.manual_seed(0)
    x = torch.randn(3, 40, dtype=torch.float32)
    w = torch.randn(40, dtype=torch.float32)
    x64 = x.double()
    ref = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(cpu.rmsnorm(x, w, 1e-6).double(), ref, rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(3, 80, dtype=torch.float32)
    g, u = gate_up.double().chunk(2, -1)
    torch.testing.assert_close(
        cpu.silu_and_mul(gate_up).double(), g * torch.sigmoid(g) * u, rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        cpu.softmax(x, dim=-1).double(), torch.softmax(x64, -1), rtol=1e-5, atol=1e-6
    )
    torch.testing.assert_close(cpu.add_constant(x, 4).double(), x64 + 4)
    print(loaded)
""")


def test_every_cpu_op_runs_from_a_prebuilt_cache_without_a_toolchain(cpu_prebuilt, tmp_path):
    before = _tree(cpu_prebuilt)
    writable = tmp_path / "writable"
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CUDA_HOME", "CUDA_PATH", "CXX", "MLLM_KERNEL_CUDA_ARCH_LIST")
    }
    env.update(
        PATH=str(tmp_path / "empty-bin"),
        PYTHONPATH=CHILD_PYTHONPATH,
        MLLM_KERNEL_CACHE_PATH=f"{tmp_path / 'absent'}{os.pathsep}{cpu_prebuilt}",
        MLLM_KERNEL_CACHE_DIR=str(writable),
    )
    run = subprocess.run(
        [sys.executable, "-c", NO_TOOLCHAIN_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    variants = sum(len(e.variants) for e in mllm_kernel.jit_utils.registry.kernels("cpu"))
    assert int(run.stdout.strip()) == variants > 0
    assert "WARNING" not in run.stderr and "compiling" not in run.stderr, run.stderr
    assert _tree(cpu_prebuilt) == before  # nothing written: no lock, no log, no staging
    assert not writable.exists()  # and nothing built


def test_prebuilt_entries_name_the_package_files_by_anchor(cpu_prebuilt):
    entries = [p for p in cpu_prebuilt.iterdir() if not p.name.startswith(".")]
    assert entries
    for entry in entries:
        manifest = cache.Manifest.read(entry)
        assert manifest.deps and all(d.startswith("@") for d in manifest.deps), manifest.deps
        assert manifest.toolchain_deps == {} and manifest.include_search == []
        assert manifest.toolchain["cxx"]  # who built it is recorded, not required
        assert not entry.stat().st_mode & 0o022 and entry.stat().st_mode & 0o005 == 0o005


def _spec(source: Path, k: int = 3) -> BuildSpec:
    return cpu_spec("ok", str(k), cpp_files=[source], cpp_wrappers=[("f", f"ok::f<{k}>")])


def _load(source: Path):
    return load_cpu_jit("ok", "3", cpp_files=[str(source)], cpp_wrappers=[("f", "ok::f<3>")])


@pytest.fixture
def user_prebuilt(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """``(source, prebuilt root)``: ok<3> built in one cache and exported to another."""
    source = tmp_path / "ok.cpp"
    source.write_text(OK_SOURCE)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(tmp_path / "builder"))
    assert _load(source).f() == 3
    output = tmp_path / "prebuilt"
    prebuilt.export(_spec(source), module_key(_spec(source)).path, output)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(tmp_path / "writable"))
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(output))
    return source, output


def _chown_tree(root: Path, uid: int) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in filenames)]:
            os.chown(name, uid, uid)


NOT_TRUSTED = "not by you, root or an owner in MLLM_KERNEL_TRUSTED_CACHE_OWNERS"


@needs_root
def test_a_prebuilt_cache_of_another_owner_is_used_only_when_they_are_trusted(
    user_prebuilt, tmp_path, monkeypatch, warnings_logged
):
    # Before: any owner was accepted, so a cache another user left under /tmp ran their
    # library's constructor in every process that named it.
    source, output = user_prebuilt
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    theirs = sticky / "prebuilt"
    output.rename(theirs)
    _chown_tree(theirs, NOBODY)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(theirs))

    assert prebuilt.find(_spec(source)) is None
    (warning,) = [w for w in warnings_logged if "prebuilt cache entry not used" in w]
    assert f"{theirs} is owned by nobody (uid 65534), {NOT_TRUSTED}" in warning
    assert "if you trust nobody (uid 65534), set MLLM_KERNEL_TRUSTED_CACHE_OWNERS=nobody" in (
        warning
    )
    assert _load(source).f() == 3
    assert (tmp_path / "writable").is_dir()  # built privately instead
    for trusted in ("nobody", str(NOBODY), " root , nobody "):
        monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", trusted)
        found = prebuilt.find(_spec(source))
        assert found is not None and found.artifact.parent.parent == theirs, trusted


@needs_root
def test_a_prebuilt_cache_inside_a_directory_of_another_owner_needs_them_trusted(
    user_prebuilt, tmp_path, monkeypatch, warnings_logged
):
    # Its owner could swap the cache (ours) for one of theirs between the check and the load.
    source, output = user_prebuilt
    parent = tmp_path / "theirs"
    parent.mkdir()
    inside = parent / "prebuilt"
    output.rename(inside)
    os.chown(parent, NOBODY, NOBODY)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(inside))

    assert prebuilt.find(_spec(source)) is None
    (warning,) = [w for w in warnings_logged if "prebuilt cache entry not used" in w]
    assert f"the path to {inside} passes through {parent}, which is owned by nobody" in warning
    assert NOT_TRUSTED in warning and "MLLM_KERNEL_TRUSTED_CACHE_OWNERS=nobody" in warning
    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", "nobody")
    assert prebuilt.find(_spec(source)) is not None


@needs_root
def test_a_trusted_owner_s_cache_others_can_write_is_still_refused(
    user_prebuilt, monkeypatch, warnings_logged
):
    source, output = user_prebuilt
    _chown_tree(output, NOBODY)
    output.chmod(0o775)
    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", "nobody")
    assert prebuilt.find(_spec(source)) is None
    (warning,) = [w for w in warnings_logged if "prebuilt cache entry not used" in w]
    assert f"{output} is writable by its group" in warning


def test_an_unknown_trusted_owner_is_a_warning_naming_the_variable(
    user_prebuilt, monkeypatch, warnings_logged
):
    source, _ = user_prebuilt
    unknown = f"no_such_user_{uuid.uuid4().hex[:8]}"  # new to this process: warned once
    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", f"{unknown}, {NOBODY}")
    assert env.trusted_cache_owners() == (unknown, str(NOBODY))
    assert prebuilt.find(_spec(source)) is not None  # the cache is ours: still used
    assert warnings_logged == [
        f"MLLM_KERNEL_TRUSTED_CACHE_OWNERS: no user named {unknown!r} on this machine, so "
        "caches it owns are not trusted. Fix: give user names from /etc/passwd or numeric "
        "uids, comma-separated (e.g. MLLM_KERNEL_TRUSTED_CACHE_OWNERS=builder,1001)"
    ]
    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", " , ")
    assert env.trusted_cache_owners() == ()


@pytest.mark.parametrize(
    ("where", "mode", "expected"),
    [("root", 0o777, "group and others"), ("entry", 0o775, "its group")],
)
def test_a_writable_prebuilt_cache_is_not_used(
    user_prebuilt, tmp_path, warnings_logged, where, mode, expected
):
    source, output = user_prebuilt
    target = output if where == "root" else relocatable_key(_spec(source), output).path
    target.chmod(mode)
    assert prebuilt.find(_spec(source)) is None
    (warning,) = [w for w in warnings_logged if "prebuilt cache entry not used" in w]
    assert f"{target} is writable by {expected}" in warning and "chmod -R go-w" in warning
    assert _load(source).f() == 3
    assert (tmp_path / "writable").is_dir()  # built privately instead


def test_a_prebuilt_entry_whose_source_changed_is_not_used(user_prebuilt, warnings_logged):
    source, _ = user_prebuilt
    source.write_text(OK_SOURCE.replace("return K;", "return K + 1;"))
    assert prebuilt.find(_spec(source)) is None
    assert any(f"{source} changed" in w for w in warnings_logged), warnings_logged
    assert _load(source).f() == 4  # rebuilt from the new source, not the prebuilt 3


def test_relocatable_key_needs_no_toolchain_and_ignores_where_the_package_is(monkeypatch):
    spec = _spec(paths.kernel_source_dir("cpu") / "rmsnorm.cpp")
    before = relocatable_key(spec, Path("/x")).hash
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    from mllm_kernel.jit_utils import toolchain

    toolchain.reset()
    try:
        assert relocatable_key(spec, Path("/x")).hash == before
    finally:
        toolchain.reset()
    material = relocatable_key_material(spec)
    assert material["spec"]["cpp_files"] == ["@cpu/rmsnorm.cpp"]
    assert "cxx" not in material and "include_dirs" not in material


def test_precompile_output_builds_one_entry_per_arch(tmp_path, monkeypatch):
    jobs = []

    def fake_run_job(job, load, output):
        from mllm_kernel.jit_utils.cuda_arch import resolve_cuda_archs

        jobs.append((job.entry.name, job.arch, tuple(map(str, resolve_cuda_archs())), output))
        return precompile.JobResult(job, "built", 0.0)

    monkeypatch.setattr(precompile, "run_job", fake_run_job)
    monkeypatch.setattr(precompile, "cuda_unavailable_reason", lambda: None)
    report = precompile.precompile(
        device="cuda", kernels=["add_constant"], arch="9.0a,10.0a", output=tmp_path
    )
    archs = {(arch, built) for _, arch, built, _ in jobs}
    assert archs == {("9.0a", ("9.0a",)), ("10.0a", ("10.0a",))}
    assert len(report.results) == len(jobs) and all(o == tmp_path for *_, o in jobs)


def test_precompile_cli_output_writes_a_prebuilt_cache(tmp_path, capsys):
    from mllm_kernel.__main__ import main

    output = tmp_path / "out"
    code = main(
        ["precompile", "--device", "cpu", "--kernel", "add_constant", "--output", str(output)]
    )
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f"prebuilt cache: {output}" in printed and "MLLM_KERNEL_CACHE_PATH" in printed
    entries = [p for p in output.iterdir() if p.name.startswith("add_constant_cpu_")]
    kernels = mllm_kernel.jit_utils.registry.kernels("cpu")
    assert len(entries) == sum(len(e.variants) for e in kernels if e.name == "add_constant") > 0
    assert all(cache.Manifest.read(e).deps for e in entries)


def test_precompile_builds_nothing_a_prebuilt_cache_serves(
    cpu_prebuilt, tmp_path, monkeypatch, capsys
):
    """Variants a read-only cache serves are counted as served, not built again into the
    writable cache (the loader takes them from the read-only one); with none, they build."""
    from mllm_kernel.__main__ import main

    writable = tmp_path / "writable"
    monkeypatch.setenv("MLLM_KERNEL_CACHE_DIR", str(writable))
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(cpu_prebuilt))
    variants = sum(len(e.variants) for e in registry.kernels("cpu") if e.name == "add_constant")
    code = main(["precompile", "--device", "cpu", "--kernel", "add_constant"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    served = f"{variants} served by a prebuilt cache"
    assert f": 0 built, 0 already cached, {served}, 0 failed" in printed
    assert not list(writable.glob("add_constant_cpu_*"))

    monkeypatch.delenv("MLLM_KERNEL_CACHE_PATH")
    code = main(["precompile", "--device", "cpu", "--kernel", "add_constant"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert f": {variants} built, 0 already cached, 0 failed" in printed
    assert len(list(writable.glob("add_constant_cpu_*"))) == variants


# Like NO_TOOLCHAIN_PROBE, for every CUDA kernel variant on the GPU the child sees (its arch
# comes from the GPU: MLLM_KERNEL_CUDA_ARCH_LIST is unset there).
NO_TOOLCHAIN_CUDA_PROBE = REFUSE_PROCESSES + textwrap.dedent("""

    from mllm_kernel.jit_utils import registry

    loaded = 0
    for entry in registry.kernels("cuda"):
        for variant in entry.variants:
            module = entry.builder(*variant)
            for export in entry.spec(variant).exports:
                module.get_function(export)
            loaded += 1
    x = torch.randn(4, 256, device="cuda", dtype=torch.float16)
    from mllm_kernel.cuda import jit as cuda_ops
    torch.testing.assert_close(cuda_ops.add_constant(x, 2), x + 2)
    print(loaded)
""")


@pytest.mark.cuda
def test_every_cuda_kernel_loads_from_a_prebuilt_cache_without_a_toolchain(tmp_path):
    from mllm_kernel.jit_utils.cuda_arch import resolve_cuda_archs

    output = tmp_path / "prebuilt"
    arch = ",".join(str(a) for a in resolve_cuda_archs())  # this GPU's arch, as the child's
    report = precompile.precompile(device="cuda", arch=arch, output=output)
    assert report.results and not report.failures, report.failures
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("CUDA_HOME", "CUDA_PATH", "CXX", "MLLM_KERNEL_CUDA_ARCH_LIST")
        and key != "TORCH_CUDA_ARCH_LIST"
    }
    env.update(
        PATH=str(tmp_path / "empty-bin"),
        PYTHONPATH=CHILD_PYTHONPATH,
        MLLM_KERNEL_CACHE_PATH=str(output),
        MLLM_KERNEL_CACHE_DIR=str(tmp_path / "writable"),
    )
    run = subprocess.run(
        [sys.executable, "-c", NO_TOOLCHAIN_CUDA_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) == len(report.results)
    assert "compiling" not in run.stderr and not (tmp_path / "writable").exists()


FIND_CUDA_PROBE = textwrap.dedent("""
    import os, subprocess
    import torch  # its CUDA bindings run ldconfig at import: not ours to refuse

    def refuse(*args, **kwargs):
        raise AssertionError(f"tried to start a process: {args[:1]}")

    subprocess.Popen.__init__ = refuse
    os.posix_spawn = os.posix_spawnp = os.system = os.execv = os.execve = os.fork = refuse

    from mllm_kernel.jit_utils import prebuilt, registry

    (entry,) = [e for e in registry.kernels("cuda") if e.name == "add_constant_runtime"]
    found = [prebuilt.find(entry.spec(variant)) for variant in entry.variants]
    assert all(f is not None and f.status == "hit" for f in found), found
    print(len(found))
""")


@pytest.mark.nvcc
def test_cuda_entries_are_found_in_a_prebuilt_cache_without_a_toolchain(tmp_path):
    # Loading needs a GPU (the cuda-marked test above); finding them needs nothing: the
    # relocatable key of a CUDA build is computed with no nvcc and no C++ compiler. One
    # package module (one variant) shows it; each nvcc build costs seconds on two cores.
    output = tmp_path / "prebuilt"
    report = precompile.precompile(
        device="cuda", kernels=["add_constant_runtime"], arch="9.0a", output=output
    )
    assert report.results and not report.failures, report.failures
    wheel = cache_wheel.pack(output, tmp_path / "dist")
    assert wheel.name.startswith(f"mllm_kernel_cache_sm90a-{mllm_kernel.__version__}-")
    env = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH", "CXX")}
    env.update(
        PATH=str(tmp_path / "empty-bin"),
        PYTHONPATH=CHILD_PYTHONPATH,
        MLLM_KERNEL_CACHE_PATH=str(output),
        MLLM_KERNEL_CACHE_DIR=str(tmp_path / "writable"),
        MLLM_KERNEL_CUDA_ARCH_LIST="9.0a",
    )
    run = subprocess.run(
        [sys.executable, "-c", FIND_CUDA_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert int(run.stdout.strip()) == len(report.results)


def test_show_config_says_which_cache_serves_each_variant(cpu_prebuilt, monkeypatch, capsys):
    from mllm_kernel.__main__ import main
    from mllm_kernel.jit_utils import cache_admin

    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(cpu_prebuilt))
    report = cache_admin.config_report(device="cpu")
    statuses = [s for k in report.kernels if k.builtin for s in k.variants]
    assert statuses and all(s.status == "prebuilt" for s in statuses), statuses
    assert all(s.path.parent == cpu_prebuilt for s in statuses)
    assert main(["show-config", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    assert printed.count("prebuilt") >= len(statuses) and str(cpu_prebuilt) in printed

    monkeypatch.delenv("MLLM_KERNEL_CACHE_PATH")
    report = cache_admin.config_report(device="cpu")
    assert not any(s.status == "prebuilt" for k in report.kernels for s in k.variants)


@needs_root
def test_show_config_says_why_a_prebuilt_cache_of_another_owner_is_not_used(
    cpu_prebuilt, tmp_path, monkeypatch, warnings_logged
):
    from mllm_kernel.jit_utils import cache_admin

    theirs = tmp_path / "theirs"
    shutil.copytree(cpu_prebuilt, theirs)
    _chown_tree(theirs, NOBODY)
    monkeypatch.setenv("MLLM_KERNEL_CACHE_PATH", str(theirs))
    report = cache_admin.config_report(device="cpu")
    statuses = [s for k in report.kernels if k.builtin for s in k.variants]
    assert statuses and not any(s.status == "prebuilt" for s in statuses)
    (warning,) = [w for w in warnings_logged if "prebuilt cache entry not used" in w]
    assert f"{theirs} is owned by nobody (uid 65534), {NOT_TRUSTED}" in warning

    monkeypatch.setenv("MLLM_KERNEL_TRUSTED_CACHE_OWNERS", str(NOBODY))
    report = cache_admin.config_report(device="cpu")
    statuses = [s for k in report.kernels if k.builtin for s in k.variants]
    assert all(s.status == "prebuilt" and s.path.parent == theirs for s in statuses)


# ---------------------------------------------------------------------------
# precompile --wheel: the prebuilt cache as an installable wheel, found with no setting
# ---------------------------------------------------------------------------
def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_a_cpu_cache_packs_into_a_wheel_with_a_valid_record(cpu_prebuilt, tmp_path):
    wheel = cache_wheel.pack(cpu_prebuilt, tmp_path / "dist")
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    version = mllm_kernel.__version__
    assert wheel.name == f"mllm_kernel_cache_cpu-{version}-py3-none-{platform}.whl"
    dist_info = f"mllm_kernel_cache_cpu-{version}.dist-info"
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    rows = [line.split(",") for line in files.pop(f"{dist_info}/RECORD").decode().splitlines()]
    assert [f"{dist_info}/RECORD", "", ""] in rows
    recorded = {name: (digest, size) for name, digest, size in rows if digest}
    assert recorded == {name: (_record_hash(data), str(len(data))) for name, data in files.items()}
    entries = [p for p in cpu_prebuilt.iterdir() if not p.name.startswith(".")]
    for entry in entries:
        for item in entry.iterdir():
            packed = files[f"mllm_kernel_cache_cpu/cache/{entry.name}/{item.name}"]
            assert packed == item.read_bytes()
    assert b"CACHE_DIR" in files["mllm_kernel_cache_cpu/__init__.py"]
    metadata = files[f"{dist_info}/METADATA"].decode()
    assert "Name: mllm-kernel-cache-cpu\n" in metadata
    assert f"Requires-Dist: mllm-kernel=={version}\n" in metadata
    assert f"Requires-Dist: apache-tvm-ffi=={tvm_ffi.__version__}\n" in metadata
    assert f"Tag: py3-none-{platform}\n" in files[f"{dist_info}/WHEEL"].decode()
    assert cache_wheel.pack(cpu_prebuilt, tmp_path / "again").read_bytes() == wheel.read_bytes()


def test_packing_a_directory_without_entries_says_what_to_do(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no current cache entries to pack; fill"):
        cache_wheel.pack(tmp_path, tmp_path / "dist")


def test_stale_entries_are_left_out_of_the_wheel(cpu_prebuilt, tmp_path, warnings_logged):
    """An entry whose source changed since precompile (its recorded digest no longer
    matches) would be refused by every load: the wheel leaves it out and says so."""
    copy = tmp_path / "cache"
    shutil.copytree(cpu_prebuilt, copy)
    entries = sorted(p for p in copy.iterdir() if not p.name.startswith("."))
    stale = entries[0]
    manifest = json.loads((stale / "manifest.json").read_text())
    manifest["deps"] = {dep: "0" * 64 for dep in manifest["deps"]}
    (stale / "manifest.json").write_text(json.dumps(manifest))
    with zipfile.ZipFile(cache_wheel.pack(copy, tmp_path / "dist")) as archive:
        packed = {name.split("/")[2] for name in archive.namelist() if "/cache/" in name}
    assert packed == {p.name for p in entries[1:]}
    assert [w for w in warnings_logged if "not packed" in w] == [
        f"not packed: {stale} is stale ({next(iter(manifest['deps']))} changed); "
        "precompile it again"
    ]


PIP_INSTALL = (sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile")


@pytest.fixture(scope="module")
def installed_cpu_wheel(cpu_prebuilt, tmp_path_factory) -> Path:
    """The CPU cache's wheel, installed by pip into a directory of its own (as in an image)."""
    base = tmp_path_factory.mktemp("wheel")
    wheel = cache_wheel.pack(cpu_prebuilt, base / "dist")
    target = base / "site"
    run = subprocess.run(
        [*PIP_INSTALL, "--target", str(target), str(wheel)],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.umask(0o022),  # what an image build has; 002 would be refused
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return target


def test_an_installed_cache_wheel_serves_every_cpu_op_without_a_toolchain(
    installed_cpu_wheel, tmp_path
):
    before = _tree(installed_cpu_wheel)
    writable = tmp_path / "writable"
    env = {
        key: value
        for key, value in os.environ.items()
        if key
        not in (
            "CUDA_HOME",
            "CUDA_PATH",
            "CXX",
            "MLLM_KERNEL_CUDA_ARCH_LIST",
            "MLLM_KERNEL_CACHE_PATH",
        )
    }
    env.update(
        PATH=str(tmp_path / "empty-bin"),
        PYTHONPATH=os.pathsep.join((PACKAGE_PARENT, str(installed_cpu_wheel), CHILD_PYTHONPATH)),
        MLLM_KERNEL_CACHE_DIR=str(writable),
    )
    run = subprocess.run(
        [sys.executable, "-c", NO_TOOLCHAIN_PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    variants = sum(len(e.variants) for e in mllm_kernel.jit_utils.registry.kernels("cpu"))
    assert int(run.stdout.strip()) == variants > 0
    assert "WARNING" not in run.stderr and "compiling" not in run.stderr, run.stderr
    assert _tree(installed_cpu_wheel) == before  # nothing written beside the package
    assert not writable.exists()  # and nothing built


def test_show_config_names_the_installed_cache_package(installed_cpu_wheel, monkeypatch, capsys):
    from mllm_kernel.__main__ import main
    from mllm_kernel.jit_utils import cache_admin

    monkeypatch.delenv("MLLM_KERNEL_CACHE_PATH", raising=False)
    monkeypatch.syspath_prepend(str(installed_cpu_wheel))
    origin = f"package mllm-kernel-cache-cpu {mllm_kernel.__version__}"
    assert prebuilt.read_only_caches() == [
        prebuilt.ReadOnlyCache(installed_cpu_wheel / "mllm_kernel_cache_cpu" / "cache", origin)
    ]
    report = cache_admin.config_report(device="cpu")
    statuses = [s for k in report.kernels if k.builtin for s in k.variants]
    assert statuses and all(s.status == "prebuilt" and s.detail == origin for s in statuses)
    assert main(["show-config", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.count(f"(from {origin})") == len(statuses)


def test_installed_caches_are_found_by_package_name_first_on_the_path_wins(
    tmp_path, monkeypatch, warnings_logged
):
    first, second = tmp_path / "first", tmp_path / "second"
    for site in (first, second):
        (site / "mllm_kernel_cache_sm90a" / "cache").mkdir(parents=True)
    (first / "mllm_kernel_cache_sm90a-0.1.0.dist-info").mkdir()
    (second / "mllm_kernel_cache_cpu" / "cache").mkdir(parents=True)
    (second / "mllm_kernel_cache_broken").mkdir()  # no cache/: said, then skipped
    (second / "mllm_kernel_cache_notes.txt").write_text("not a package")
    monkeypatch.delenv("MLLM_KERNEL_CACHE_PATH", raising=False)
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))
    assert prebuilt.read_only_caches() == [
        prebuilt.ReadOnlyCache(
            second / "mllm_kernel_cache_cpu" / "cache", "package mllm-kernel-cache-cpu"
        ),
        prebuilt.ReadOnlyCache(
            first / "mllm_kernel_cache_sm90a" / "cache", "package mllm-kernel-cache-sm90a 0.1.0"
        ),
    ]
    assert warnings_logged == [
        f"installed cache package {second / 'mllm_kernel_cache_broken'} has no cache/ "
        "directory; reinstall it"
    ]


def test_precompile_cli_wheel_writes_the_wheel_beside_the_output(tmp_path, capsys):
    from mllm_kernel.__main__ import main

    output = tmp_path / "out"
    args = ["precompile", "--device", "cpu", "--kernel", "add_constant", "--output", str(output)]
    assert main([*args, "--wheel"]) == 0
    (wheel,) = tmp_path.glob("*.whl")
    assert wheel.name.startswith(f"mllm_kernel_cache_cpu-{mllm_kernel.__version__}-py3-none-")
    assert f"wheel: {wheel}" in capsys.readouterr().out
    assert main([*args, "--wheel", str(tmp_path / "dist")]) == 0
    assert (tmp_path / "dist" / wheel.name).read_bytes() == wheel.read_bytes()


def test_precompile_cli_wheel_needs_an_output(capsys):
    from mllm_kernel.__main__ import main

    assert main(["precompile", "--device", "cpu", "--wheel"]) == 2
    assert "--wheel needs --output DIR" in capsys.readouterr().err
