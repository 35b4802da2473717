"""Copies, out of released wheels, exactly the files the field backends read (and the two DeepGEMM
API files the CPU tests read), into OUT/<release>/<path inside the wheel> with OUT/manifest.json.

    python3 scripts/prepare_field_deps.py [OUT]        (OUT: .device-deps/field, git-ignored)

Each release folder is what goes first on PYTHONPATH to test that release (docs/versions.md); nothing
here is imported, built or committed. Where each file comes from:
* the pinned wheel in DIFFTEST_WHEEL_CACHE (default ~/.cache/difftest-wheels) when it is there;
* otherwise the member alone, read from the package index (PIP_INDEX_URL, default PyPI) over HTTP
  range requests: the zip's central directory, then the member's own bytes. For vLLM that is about
  0.7 MB of a 240-340 MB wheel; for all five wheels about 4 MB.
Every file is checked against its pinned sha256, so a cache or an index cannot hand over other bytes.
Idempotent: a file already there with the right digest is kept. Safe to run from two processes at once
(the test workers do): the second waits for the first on OUT/.lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import io
import json
import os
import re
import ssl
import sys
import time
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

DEFAULT_OUT = Path(".device-deps/field")
INDEX = "https://pypi.org/simple"
TIMEOUT_S = 30
READ_AHEAD = 1 << 18  # bytes fetched per small read: a member's local header and its data in one request


@dataclasses.dataclass(frozen=True)
class Release:
    """Files of one wheel that one folder of OUT holds."""

    folder: str  # OUT/<folder>: the sys.path entry for this release
    project: str  # its name on the index
    wheel: str  # the pinned wheel file
    files: dict[str, str]  # path inside the wheel -> sha256


STEP5 = "cb2a1865a1b2947f003e692e4e38631adc9221b69fea1544d2840f92f99fd27c"  # byte-identical in 0.33.0 and 0.34.0
VLLM_33 = "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
VLLM_34 = "vllm-0.34.0-cp38-abi3-manylinux_2_28_x86_64.whl"
RELEASES = (
    # difftest.backends.vllm_step5: the Step5 Hopper kernel's file and the release's version file;
    # difftest.backends.vllm_ragged: the file of its torch reference for ragged (prefill) logits;
    # difftest.backends.vllm_torch_ref: the same file's paged torch reference.
    Release("vllm-0.33.0", "vllm", VLLM_33, {
        "vllm/_version.py": "83ac00973c429411aefd8e8f33cfb4a313b438b7c07e93d2fada81db86206f92",
        "vllm/models/step5/nvidia/ops/sparse_indexer_scores.py": STEP5,
        "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py":
            "efa28d9acb9a9cf0904454478f2fc39c7e1674c479462563691ba7453937fee1"}),
    Release("vllm-0.34.0", "vllm", VLLM_34, {
        "vllm/_version.py": "b5773f66069824a6796cc4b8ceb4894510c8cc3de202e8e2a9921cf1c81c5bb5",
        "vllm/models/step5/common/ops/sparse_indexer_scores.py": STEP5,
        # difftest.backends.vllm_torch_ref: fp8_paged_mqa_logits_torch, whose next_n > 1 cache read changed.
        "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py":
            "eb88c468d78fbee494ca50912f2d5656c502f5d4d25cf3f96d8b9e7de256f9bb"}),
    # difftest.backends.sglang: the torch reference indexer and the TileLang kernel (any build tag of
    # the 0.5.23 wheel holds the same Python files; only its Rust extensions differ).
    Release("sglang-0.5.23", "sglang", "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", {
        "sglang/_version.py": "4fd058b5693ae0d57f3d2e9e826f1b39db0d57a30e1d7b7817673c037331e36f",
        "sglang/srt/layers/attention/dsv4/indexer.py":
            "4d0da92df2d73c9100ff9a235bb8312a02b412f457ea976a14fbd01825b0b9f6",
        "sglang/kernels/ops/attention/dsa/tilelang_kernel.py":
            "3b4a433299bb4ce2fc47faa6c64046abd617198559baa038983a0fef9ea36280",
        # difftest.backends.sglang_ragged: the torch reference for ragged (prefill) logits.
        "sglang/srt/layers/attention/dsa/utils.py":
            "277294e08c5df8b9a092dfc3c1992fe2a6d630da03b10248fee1af8727a9f558"}),
    # difftest.backends.flag_gems: the schedule metadata (5.0.2 has no version module; its METADATA says).
    Release("flag_gems-5.0.2", "flag-gems", "flag_gems-5.0.2-py3-none-any.whl", {
        "flag_gems-5.0.2.dist-info/METADATA": "82ea479368d743689fcfd124ad791d08da2a334b61fa1a3b4634b06dcb187138",
        "flag_gems/ops/get_paged_mqa_logits_metadata.py":
            "25832c5349ccece050b8e94e8b33954fd7dbd7a55850e93d16d3e40eb861fae6"}),
    # difftest.backends.flashinfer: the torch reference and the numpy CPU schedule.
    Release("flashinfer-0.7.2.post1", "flashinfer-python", "flashinfer_python-0.7.2.post1-py3-none-any.whl", {
        "flashinfer/_build_meta.py": "f13989e3809ae56cd801ff3aed7c4b5e0ede3afa179804ef1530b0c9c0cf843b",
        "flashinfer/trace/templates/attn_scores.py":
            "c92550e9473e36082f94ae21380403eb7f019967e8c9f71834ea6e3beac23a1c",
        "flashinfer/attn_scores/attn_scores.py": "b68ab54cf3e4f923f78abe1eb407958080e179860831bb506b3340a1c58fa274"}),
    # For the CPU tests only (never on PYTHONPATH): DeepGEMM 2.8.1's Python API as each vLLM release
    # vendors it, to check how difftest.backends.deep_gemm binds its arguments to either signature.
    Release("deep_gemm-api-vllm-0.33.0", "vllm", VLLM_33, {
        "vllm/third_party/deep_gemm/_C.py": "7c1197520bf2aaefd02abbec05ee1708b7087ea954ed587a06300665039c5d7f"}),
    Release("deep_gemm-api-vllm-0.34.0", "vllm", VLLM_34, {
        "vllm/third_party/deep_gemm/_C.py": "1c4309d392edbb1e5dc147ff9be295814f0445437bcfc5c42e2c196c6912b41c"}),
)


class FetchError(RuntimeError):
    """A file could not be had: which, from where, and why."""


# --------------------------------------------------------------------------- a wheel read over HTTP ranges

def _ssl_context() -> ssl.SSLContext:
    """The certificates pip is told to use (PIP_CERT), else the system's."""
    return ssl.create_default_context(cafile=os.environ.get("PIP_CERT") or None)


def _get(url: str, headers: dict[str, str]) -> tuple[bytes, str]:
    request = urllib.request.Request(url, headers={"User-Agent": "difftest-prepare-field-deps", **headers})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_ssl_context()) as response:
        return response.read(), response.headers.get("Content-Type", "")


class RemoteFile(io.RawIOBase):
    """A file on a web server, read with Range requests: zipfile seeks to the central directory at the
    end and to each member, so only those bytes travel."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.position = url, size, 0
        self.requests = self.fetched = 0  # what travelled, for the manifest

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.position, io.SEEK_END: self.size}[whence]
        self.position = base + offset
        return self.position

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        end = min(self.size, self.position + len(buffer))
        if end <= self.position:
            return 0
        data, _ = _get(self.url, {"Range": f"bytes={self.position}-{end - 1}"})
        self.requests += 1
        self.fetched += len(data)
        if len(data) != end - self.position:  # a server that ignores Range sends the whole file
            raise FetchError(f"{self.url}: asked for bytes {self.position}-{end - 1}, got {len(data)} bytes")
        buffer[:len(data)] = data
        self.position = end
        return len(data)


def wheel_url(release: Release, index: str) -> tuple[str, int | None]:
    """The pinned wheel's URL (and size, where the index says) from the index's project page (PEP 691
    JSON, else the HTML page's links)."""
    page = f"{index.rstrip('/')}/{re.sub(r'[-_.]+', '-', release.project).lower()}/"
    body, kind = _get(page, {"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
    if "json" in kind:
        for entry in json.loads(body)["files"]:
            if entry["filename"] == release.wheel:
                return urllib.parse.urljoin(page, entry["url"]), entry.get("size")
    else:
        for href in re.findall(r'href="([^"]+)"', body.decode()):
            if urllib.parse.urlparse(href).path.rsplit("/", 1)[-1] == release.wheel:
                return urllib.parse.urljoin(page, href.split("#")[0]), None
    raise FetchError(f"{page} lists no {release.wheel}")


def _remote_size(url: str) -> int:
    request = urllib.request.Request(url, method="HEAD", headers={"User-Agent": "difftest-prepare-field-deps"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=_ssl_context()) as response:
        return int(response.headers["Content-Length"])


@contextlib.contextmanager
def open_wheel(release: Release, cache: Path, index: str) -> Iterator[tuple[zipfile.ZipFile, RemoteFile | None]]:
    """The pinned wheel as a zip: from the cache (None beside it), else from the index over HTTP ranges
    (the RemoteFile beside it counts what travelled)."""
    cached = cache / release.wheel
    if cached.is_file():
        with zipfile.ZipFile(cached) as wheel:
            yield wheel, None
        return
    try:
        url, size = wheel_url(release, index)
        raw = RemoteFile(url, size if size is not None else _remote_size(url))
        with zipfile.ZipFile(io.BufferedReader(raw, buffer_size=READ_AHEAD)) as wheel:
            yield wheel, raw
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:  # URLError is an OSError
        raise FetchError(f"{release.wheel}: not in {cache} and not readable from {index}: "
                         f"{type(exc).__name__}: {exc}") from exc


# --------------------------------------------------------------------------- the tree

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _holds(path: Path, digest: str) -> bool:
    return path.is_file() and sha256(path.read_bytes()) == digest


def prepare_release(release: Release, out: Path, cache: Path, index: str) -> dict:
    """The release's folder (files already right are kept) and its manifest record."""
    root = out / release.folder
    wanted = {name: digest for name, digest in release.files.items() if not _holds(root / name, digest)}
    source = "already there"
    if wanted:
        with open_wheel(release, cache, index) as (wheel, remote):
            for name, digest in wanted.items():
                data = wheel.read(name)
                if sha256(data) != digest:
                    raise FetchError(f"{name} of {release.wheel} has sha256 {sha256(data)}, not the pinned {digest}")
                (root / name).parent.mkdir(parents=True, exist_ok=True)
                (root / name).write_bytes(data)
        source = f"cache {cache / release.wheel}" if remote is None else \
            f"index {remote.url} ({remote.requests} range requests, {remote.fetched} bytes)"
    return {"folder": release.folder, "wheel": release.wheel, "source": source,
            "files": {name: {"bytes": (root / name).stat().st_size, "sha256": digest}
                      for name, digest in release.files.items()}}


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepare(out: Path = DEFAULT_OUT, cache: Path | None = None, index: str | None = None) -> dict:
    """Every release's folder under `out` and `out`/manifest.json; returns the manifest. FetchError
    says which file could not be had and why."""
    cache = cache or Path(os.environ.get("DIFFTEST_WHEEL_CACHE", Path.home() / ".cache/difftest-wheels"))
    index = index or os.environ.get("PIP_INDEX_URL") or INDEX
    started = time.monotonic()
    with _locked(out):
        records = [prepare_release(release, out, cache, index) for release in RELEASES]
        manifest = {"made_by": "scripts/prepare_field_deps.py", "releases": records,
                    "seconds": round(time.monotonic() - started, 2)}
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT
    try:
        manifest = prepare(out)
    except FetchError as exc:
        raise SystemExit(f"prepare_field_deps: {exc}") from None
    for record in manifest["releases"]:
        print(f"{record['folder']:28} {len(record['files'])} files  from {record['source']}")
    print(f"{out}: {manifest['seconds']} s")


if __name__ == "__main__":
    main()
