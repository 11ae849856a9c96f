"""clear-cache and the cache listing behind show-config, on private caches of fake modules."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mllm_kernel.jit_utils import build_inputs, cache, cache_admin
from mllm_kernel.jit_utils.cache_key import ModuleKey

REPO = Path(__file__).resolve().parent.parent
DAY = 86400


def fake_module(root: Path, name: str, arg: str, age_days: float = 0, device: str = "cpu") -> Path:
    """A module directory as the loader leaves it: manifest + artifact."""
    directory = root / f"{name}_{device}_{arg}_{abs(hash((name, arg))):016x}"[:80]
    directory.mkdir(parents=True)
    artifact = directory / f"{name}.so"
    artifact.write_bytes(b"\0" * 1000)
    cache.Manifest(
        name=name,
        device=device,
        template_args=[arg],
        key_hash="0" * 64,
        artifact=artifact.name,
        artifact_size=1000,
        artifact_sha256=build_inputs.file_digest(artifact),
        deps={},
        exports=[name],
        built_at=time.time() - age_days * DAY,
        build_seconds=1.0,
    ).write(directory)
    return directory


def _names(report: cache_admin.ClearReport) -> set[str]:
    return {r.path.name for r in report.removed}


def test_dry_run_removes_nothing_and_counts_bytes(fresh_cache):
    modules = [fake_module(fresh_cache, "alpha", str(i)) for i in range(3)]
    report = cache_admin.clear_cache(dry_run=True)
    assert report.dry_run and report.count == 3
    assert report.bytes == sum(cache_admin.tree_size(m) for m in modules) > 3000
    assert all(m.is_dir() for m in modules)
    report = cache_admin.clear_cache()
    assert report.count == 3 and not any(m.exists() for m in modules)
    assert cache_admin.clear_cache().count == 0


def test_kernel_filter_does_not_take_prefix_matches(fresh_cache):
    add = fake_module(fresh_cache, "add", "1")
    add_constant = fake_module(fresh_cache, "add_constant", "1")
    report = cache_admin.clear_cache(kernel="add")
    assert _names(report) == {add.name}
    assert add_constant.is_dir()


def test_kernel_filter_takes_several_names(fresh_cache):
    alpha, beta = fake_module(fresh_cache, "alpha", "1"), fake_module(fresh_cache, "beta", "1")
    gamma = fake_module(fresh_cache, "gamma", "1")
    (fresh_cache / ".logs").mkdir()
    for name in ("alpha", "gamma"):
        (fresh_cache / ".logs" / f"{name}_cpu_1_0123.log").write_text("error")
    report = cache_admin.clear_cache(kernel=["alpha", "beta"])
    assert _names(report) == {alpha.name, beta.name, "alpha_cpu_1_0123.log"}
    assert gamma.is_dir() and (fresh_cache / ".logs" / "gamma_cpu_1_0123.log").is_file()


def test_older_than(fresh_cache):
    old = fake_module(fresh_cache, "alpha", "old", age_days=10)
    new = fake_module(fresh_cache, "alpha", "new", age_days=1)
    assert _names(cache_admin.clear_cache(older_than_days=5)) == {old.name}
    assert new.is_dir()


def test_skips_a_module_whose_lock_a_thread_holds(fresh_cache):
    busy = fake_module(fresh_cache, "alpha", "busy")
    idle = fake_module(fresh_cache, "alpha", "idle")
    key = ModuleKey(hash="", dirname=busy.name, root=fresh_cache)
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with cache.module_lock(key, purpose="test build"):
            holding.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert holding.wait(10)
        report = cache_admin.clear_cache()
    finally:
        release.set()
        thread.join()
    assert report.busy == [busy]
    assert _names(report) == {idle.name}
    assert busy.is_dir()
    assert cache_admin.clear_cache().count == 1  # free again: now it goes


def test_skips_a_module_whose_lock_another_process_holds(fresh_cache):
    busy = fake_module(fresh_cache, "alpha", "busy")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path\n"
            "from mllm_kernel.jit_utils import cache\n"
            "from mllm_kernel.jit_utils.cache_key import ModuleKey\n"
            f"key = ModuleKey(hash='', dirname={busy.name!r}, root=Path({str(fresh_cache)!r}))\n"
            "with cache.module_lock(key, purpose='test build'):\n"
            "    print('locked', flush=True); sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        report = cache_admin.clear_cache()
        assert report.busy == [busy] and report.count == 0 and busy.is_dir()
    finally:
        holder.communicate("\n", timeout=30)
    assert cache_admin.clear_cache().count == 1


def test_never_touches_anything_outside_the_root(fresh_cache, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("keep me")
    fake_module(fresh_cache, "alpha", "1")
    # A symlink in the root named like a module, and one inside a module directory.
    (fresh_cache / "alpha_cpu_2_0123456789abcdef").symlink_to(outside, target_is_directory=True)
    inner = fake_module(fresh_cache, "alpha", "3")
    (inner / "link").symlink_to(outside, target_is_directory=True)
    report = cache_admin.clear_cache()
    assert report.count == 2
    assert (outside / "precious.txt").read_text() == "keep me"
    assert [why for _, why in report.skipped] == ["a symlink (never followed)"]
    assert (fresh_cache / "alpha_cpu_2_0123456789abcdef").is_symlink()


def test_staging_leftovers_and_logs(fresh_cache):
    module = fake_module(fresh_cache, "alpha", "1")
    staging = fresh_cache / ".staging"
    dead = staging / f"{module.name}.12345.deadbeef"
    dead.mkdir(parents=True)
    (dead / "main.cpp").write_text("int x;")
    live_name = "beta_cpu_1_0123456789abcdef"
    live = staging / f"{live_name}.999.cafebabe"
    live.mkdir()
    logs = fresh_cache / ".logs"
    logs.mkdir()
    (logs / f"{module.name}.log").write_text("error: x")
    key = ModuleKey(hash="", dirname=live_name, root=fresh_cache)
    with cache.module_lock(key, purpose="test build"):
        report = cache_admin.clear_cache()
    kinds = {(r.kind, r.path.name) for r in report.removed}
    assert ("staging", dead.name) in kinds and ("log", f"{module.name}.log") in kinds
    assert report.busy == [live] and live.is_dir() and not dead.exists()


def test_a_shared_root_loses_nothing_but_entries(fresh_cache):
    """MLLM_KERNEL_CACHE_DIR=~/.cache: other programs' directories there (any name that
    is not an entry's) are neither listed nor removed, dry run or not."""
    module = fake_module(fresh_cache, "alpha", "1")
    others = [fresh_cache / "huggingface" / "hub", fresh_cache / "pip", fresh_cache / "alpha_cpu"]
    for other in others:
        other.mkdir(parents=True)
        (other / "weights.safetensors").write_text("keep me")
    assert [m.path for m in cache_admin.cached_modules()] == [module]
    assert _names(cache_admin.clear_cache(dry_run=True)) == {module.name}
    report = cache_admin.clear_cache()
    assert _names(report) == {module.name} and report.skipped == []
    assert all((o / "weights.safetensors").read_text() == "keep me" for o in others)


def test_missing_root_is_fine(fresh_cache):
    assert not fresh_cache.exists()
    report = cache_admin.clear_cache()
    assert report.count == 0 and report.bytes == 0


def test_cached_modules_reports_unreadable_manifests(fresh_cache):
    fake_module(fresh_cache, "alpha", "1")
    broken = fresh_cache / "broken_cpu_0123456789abcdef"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    found = {m.path.name: m for m in cache_admin.cached_modules()}
    assert (
        found[broken.name].manifest is None and "no readable manifest" in found[broken.name].error
    )
    assert found[next(n for n in found if n.startswith("alpha"))].name == "alpha"
    # Unreadable modules match a --kernel filter by their directory name.
    assert _names(cache_admin.clear_cache(kernel="broken")) == {broken.name}


def test_clear_cache_cli(fresh_cache):
    fake_module(fresh_cache, "alpha", "1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLLM_KERNEL_CACHE_DIR": str(fresh_cache)}
    command = [sys.executable, "-m", "mllm_kernel", "clear-cache"]
    dry = subprocess.run([*command, "--dry-run"], capture_output=True, text=True, env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would remove module" in dry.stdout and "would remove 1 item(s)" in dry.stdout
    assert "\033[" not in dry.stdout
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0 and "removed 1 item(s)" in done.stdout
    assert cache_admin.cached_modules() == []


def test_clear_cache_cli_kernel_repeats(fresh_cache):
    kept = fake_module(fresh_cache, "gamma", "1")
    for name in ("alpha", "beta"):
        fake_module(fresh_cache, name, "1")
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLLM_KERNEL_CACHE_DIR": str(fresh_cache)}
    command = [sys.executable, "-m", "mllm_kernel", "clear-cache"]
    done = subprocess.run(
        [*command, "--kernel", "alpha", "--kernel", "beta"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "removed 2 item(s)" in done.stdout
    assert [m.path for m in cache_admin.cached_modules()] == [kept]


@pytest.mark.parametrize("bad", [["--older-than", "soon"], ["--older-than", "-1"], ["--bogus"]])
def test_clear_cache_bad_flags_exit_2(bad, capsys):
    from mllm_kernel.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["clear-cache", *bad])
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_an_unknown_kernel_name_is_an_error_and_removes_nothing(fresh_cache, capsys):
    # Before: "removed 0 item(s)", exit 0, for a typo that precompile refuses.
    from mllm_kernel.__main__ import main

    kept = [fake_module(fresh_cache, "rmsnorm", "1"), fake_module(fresh_cache, "mine", "1")]
    with pytest.raises(ValueError) as info:
        cache_admin.clear_cache(kernel=["rmsnrom", "mine"])
    message = str(info.value)
    assert message.startswith("unknown kernel(s) 'rmsnrom' (did you mean 'rmsnorm'?): ")
    assert "nothing was removed" in message and "Known: " in message
    assert "mine" in message.split("Known: ")[1] and "softmax" in message.split("Known: ")[1]
    assert main(["clear-cache", "--kernel", "rmsnrom"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mllm_kernel clear-cache: error: unknown kernel(s) 'rmsnrom'")
    assert all(m.is_dir() for m in kept)
    # Known names: in the cache only (a user kernel from another process), or only
    # registered (nothing cached yet), are fine.
    assert _names(cache_admin.clear_cache(kernel="mine", dry_run=True)) == {kept[1].name}
    assert cache_admin.clear_cache(kernel="softmax", dry_run=True).count == 0
    assert main(["clear-cache", "--kernel", "softmax"]) == 0
