"""Builds the version carry tree .device-deps/versions/ (run through scripts/prepare_versions.sh).

From each vllm release wheel (pip's download cache; fetched when missing):
* deep_gemm-<vllm>.tar.xz  vllm/third_party/deep_gemm, re-rooted as `deep_gemm/`, so that the directory
  it is unpacked into, put first on PYTHONPATH, shadows any other deep_gemm. Releases whose
  vendored tree is byte-identical share the archive of the first of them (manifest: `releases`).
  Nothing is dropped: __init__ imports `testing`, `utils`, `mega` and `legacy`, and the JIT compiles
  against include/ (cute, cutlass, deep_gemm). xz, not gzip: the five trees are 24 MB in xz,
  43 MB in gzip, and the device's carry is 64 MiB for everything.
* vllm-<vllm>/vllm/...     the one file holding vLLM's Triton decode indexer kernel and its wrapper
  (KERNEL_FILE), plus vllm/_version.py, for releases that have the kernel. No vllm/__init__.py:
  difftest.backends.vllm_indexer loads the kernel from the file without importing vllm.
From a git checkout of ROCm/aiter (AITER_GIT_DIR):
* aiter-main/aiter/...      the Triton paged MQA logits kernel file and its wrapper, and the ragged logits
  kernel file (AITER_FILES),
  empty package __init__s, and an _version.py naming the commit (setuptools-scm writes that file
  at build time; a bare checkout has none).
Then manifest.json: every entry, its source (wheel and sha256, or repository and commit) and size.
Idempotent: an archive or directory already there is kept, the manifest is rewritten.
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

DEEP_GEMM_PREFIX = "vllm/third_party/deep_gemm/"
KERNEL_FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
KERNEL_FUNCTION = "_fp8_paged_mqa_logits_decode_kernel"
# What vllm_indexer executes from KERNEL_FILE; their digest tells releases with the same kernel apart.
DECODE_DEFS = ("_fp8_paged_mqa_logits_decode_kernel", "rocm_fp8_paged_mqa_logits_triton", "_decode_cu_count")
VERSION_FILE = "vllm/_version.py"
AITER_FILES = ("aiter/ops/triton/_triton_kernels/attention/pa_mqa_logits.py",
               "aiter/ops/triton/attention/pa_mqa_logits.py",
               # difftest.backends.aiter_ragged: the ragged (prefill) kernel, main's fix of 0.1.7's window
               "aiter/ops/triton/_triton_kernels/attention/fp8_mqa_logits.py")
AITER_PACKAGES = ("aiter", "aiter/ops", "aiter/ops/triton", "aiter/ops/triton/_triton_kernels",
                  "aiter/ops/triton/_triton_kernels/attention", "aiter/ops/triton/attention")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_for(version: str, cache: Path) -> Path:
    """The cached x86_64 wheel of vllm==version, downloaded first when missing."""
    found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}",
                        "-d", str(cache)], check=True)
        found = sorted(cache.glob(f"vllm-{version}-*x86_64.whl"))
    if not found:
        raise SystemExit(f"pip downloaded no x86_64 wheel of vllm=={version} into {cache}")
    return found[-1]


def tree_digest(members: dict[str, bytes]) -> str:
    """sha256 over the sorted (name, content digest) pairs: equal iff the trees are byte-identical."""
    digest = hashlib.sha256()
    for name in sorted(members):
        digest.update(name.encode() + b"\0" + hashlib.sha256(members[name]).digest())
    return digest.hexdigest()


def write_tar_xz(path: Path, members: dict[str, bytes], modes: dict[str, int]) -> None:
    """A reproducible archive: sorted names, zero mtimes, the wheel's permission bits."""
    tmp = path.with_suffix(".partial")
    with tarfile.open(tmp, "w:xz", preset=9) as tar:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(members[name]), modes.get(name, 0o644)
            tar.addfile(info, io.BytesIO(members[name]))
    tmp.replace(path)


def deep_gemm_version(init_source: str) -> str | None:
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)['\"]", init_source)
    return found.group(1) if found else None


def decode_defs_digest(source: str) -> str | None:
    """sha256 of the DECODE_DEFS' source text, or None when the file lacks the kernel."""
    tree = ast.parse(source)
    defs = {n.name: ast.get_source_segment(source, n) or "" for n in tree.body if isinstance(n, ast.FunctionDef)}
    if KERNEL_FUNCTION not in defs:
        return None
    return hashlib.sha256("\n".join(defs.get(name, "") for name in DECODE_DEFS).encode()).hexdigest()


def prepare_release(version: str, cache: Path, out: Path, archives: dict[str, dict]) -> dict:
    """Both carry entries of one release (where it has them) and its manifest record."""
    wheel = wheel_for(version, cache)
    record: dict = {"vllm": version, "wheel": wheel.name, "wheel_sha256": sha256_file(wheel),
                    "wheel_bytes": wheel.stat().st_size}
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(DEEP_GEMM_PREFIX) and not n.endswith("/")]
        members = {"deep_gemm/" + n.removeprefix(DEEP_GEMM_PREFIX): z.read(n) for n in names}
        modes = {"deep_gemm/" + n.removeprefix(DEEP_GEMM_PREFIX): (z.getinfo(n).external_attr >> 16) & 0o777 or 0o644
                 for n in names}
        kernel = z.read(KERNEL_FILE).decode() if KERNEL_FILE in z.namelist() else ""
        version_file = z.read(VERSION_FILE) if VERSION_FILE in z.namelist() else None
    record["deep_gemm"] = deep_gemm_entry(version, members, modes, out, archives) if members else None
    record["triton_decode"] = decode_entry(version, kernel, version_file, out)
    return record


def deep_gemm_entry(version: str, members: dict[str, bytes], modes: dict[str, int], out: Path,
                    archives: dict[str, dict]) -> dict:
    digest = tree_digest(members)
    shared = next((a for a in archives.values() if a["tree_sha256"] == digest), None)
    if shared is None:
        path = out / f"deep_gemm-{version}.tar.xz"
        if not path.is_file():
            write_tar_xz(path, members, modes)
        shared = archives[path.name] = {
            "archive": path.name, "archive_bytes": path.stat().st_size, "archive_sha256": sha256_file(path),
            "deep_gemm_version": deep_gemm_version(members["deep_gemm/__init__.py"].decode()),
            "tree_sha256": digest, "files": len(members), "unpacked_bytes": sum(map(len, members.values())),
            "releases": []}
    shared["releases"].append(version)
    return {"archive": shared["archive"], "deep_gemm_version": shared["deep_gemm_version"], "tree_sha256": digest}


def decode_entry(version: str, kernel: str, version_file: bytes | None, out: Path) -> dict | None:
    digest = decode_defs_digest(kernel) if kernel else None
    if digest is None:
        return None
    root = out / f"vllm-{version}"
    for name, data in ((KERNEL_FILE, kernel.encode()), (VERSION_FILE, version_file)):
        if data is not None:
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(data)
    return {"dir": root.name, "kernel_file": KERNEL_FILE, "decode_defs_sha256": digest,
            "bytes": sum(p.stat().st_size for p in root.rglob("*") if p.is_file())}


def git(git_dir: Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True).stdout


def prepare_aiter(git_dir: Path, out: Path, name: str) -> dict:
    """The AITER_FILES at the checkout's HEAD, in out/name, with empty package __init__s."""
    commit = git(git_dir, "rev-parse", "HEAD").decode().strip()
    describe = git(git_dir, "describe", "--tags", "--always", "HEAD").decode().strip()
    root = out / name
    for package in AITER_PACKAGES:  # the real __init__s import ROCm-only modules
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_bytes(b"")
    for path in AITER_FILES:
        (root / path).write_bytes(git(git_dir, "show", f"HEAD:{path}"))
    (root / "aiter/_version.py").write_text(
        f"# Written by scripts/prepare_versions.sh: git describe of the checkout it copied.\n"
        f"__version__ = '{describe}'\ncommit = '{commit}'\n")
    return {"name": name, "repository": "ROCm/aiter", "commit": commit, "describe": describe,
            "files": list(AITER_FILES), "bytes": sum(p.stat().st_size for p in root.rglob("*") if p.is_file())}


def main() -> None:
    out = Path(os.environ.get("OUT_DIR", ".device-deps/versions"))
    cache = Path(os.environ.get("DIFFTEST_WHEEL_CACHE", Path.home() / ".cache/difftest-wheels"))
    versions = os.environ.get("VLLM_VERSIONS", "0.30.0 0.31.0 0.32.0 0.33.0 0.34.0").split()
    git_dir = Path(os.environ.get("AITER_GIT_DIR", "/work/.mirror/ROCm+aiter/repo"))
    out.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    archives: dict[str, dict] = {}
    releases = [prepare_release(v, cache, out, archives) for v in versions]
    aiter = [prepare_aiter(git_dir, out, "aiter-main")] if git_dir.is_dir() else []
    if not aiter:
        print(f"no AITER checkout at {git_dir} (AITER_GIT_DIR): aiter-main left out", file=sys.stderr)
    manifest = {"made_by": "scripts/prepare_versions.sh", "vllm_releases": releases,
                "deep_gemm_archives": list(archives.values()), "aiter": aiter}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main()
