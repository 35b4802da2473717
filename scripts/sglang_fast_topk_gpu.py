"""On the GPU: SGLang 0.5.23's JIT `fast_topk` through difftest's adapter (`sglang-jit-fast-topk`, built and
called as `difftest run --op topk` does), and a copy of the kernel whose candidate list holds PATCHED_ENTRIES
entries per round, on the smallest case of docs/findings/sglang-fast-topk-crowded-bin.md, its control and the
crowded-bin cases. Each answer is judged by difftest's oracle (compare_topk) and compared with the CPU port's
(scripts/sglang_fast_topk_port.py): stock kernel against the port as written, patched kernel against the
port with the limit lifted. `difftest run --spec` is a paged-logits option, hence this driver.

Run by scripts/device_visit.sh sglang-fast-topk from the project root on the device (it sets the environment);
writes OUT/results.json. The three JIT builds (stock k 512 and 2048, the patched module with both) start
together.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from difftest.backends.sglang_topk import CUDA_FLAGS, SglangJitTopk, sources_dir
from difftest.core.topk import TopkCase, TopkContract, encode_topk
from difftest.engine.topk_comparison import compare_topk
from difftest.generators.topk import build_topk_case
from difftest.oracles.topk import reference
from scripts.sglang_fast_topk_port import KS, crowded_specs, fast_topk, smallest_case

NAME = "sglang-jit-fast-topk"
PATCHED_ENTRIES = 24576  # 2 x 24576 x 4 B = 192 KiB of dynamic shared memory: past the 16385-candidate bins
PATCHES = (  # (text of the carried fast_topk.cuh, its replacement): each must occur exactly once
    ("constexpr size_t kSmemBytes = 8 * 1024 * sizeof(uint32_t);  // 32KB",
     f"constexpr size_t kSmemBytes = 2 * {PATCHED_ENTRIES} * sizeof(uint32_t);  // difftest: the list raised"),
    ("    LaunchKernel(num_rows, fast_topk_detail::kThreadsPerBlock,",
     "    RuntimeDeviceCheck(::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel),\n"
     "        cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(fast_topk_detail::kSmemBytes)));\n"
     "    LaunchKernel(num_rows, fast_topk_detail::kThreadsPerBlock,"),
)
REPEATS = 3  # launches of the stock kernel per case: the dropped candidates are the last to reach an atomic


def patched_sources(root: Path) -> Path:
    """A copy of the carried JIT sources under `root` with PATCHES applied to fast_topk.cuh."""
    shutil.copytree(sources_dir(), root, dirs_exist_ok=True)
    header = root / "csrc" / "elementwise" / "fast_topk.cuh"
    text = header.read_text()
    for old, new in PATCHES:
        if text.count(old) != 1:
            raise SystemExit(f"{header}: the patch's anchor {old!r} occurs {text.count(old)} times, not once")
        text = text.replace(old, new)
    header.write_text(text)
    return root


def build_patched(root: Path) -> Any:
    """The patched kernel as one tvm-ffi module exporting fast_topk_512 and fast_topk_2048, built in a fresh
    directory (tvm-ffi's cache key does not cover included headers)."""
    import tvm_ffi.cpp  # deferred: only the GPU machine has apache-tvm-ffi

    exports = "".join(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC(fast_topk_{k}, (sglang::FastTopKKernel<{k}, true>::run));\n"
                      for k in KS)
    build = root / "build"
    build.mkdir(exist_ok=True)
    return tvm_ffi.cpp.load_inline(
        "difftest_fast_topk_patched", cuda_sources="#include <elementwise/fast_topk.cuh>\n" + exports,
        extra_include_paths=[str(root / "include"), str(root / "csrc")], extra_cuda_cflags=list(CUDA_FLAGS),
        build_directory=str(build))


def cases() -> list[TopkCase]:
    """The smallest case and its control (built here), the crowded-bin cases (built on the GPU, as the run)."""
    specs = crowded_specs()
    built = [build_topk_case(specs[name], 0, "cuda") for name in
             ("crowded-bin-2049", "crowded-bin-4097", "crowded-bin-16385", "rows-33-crowded", "rows-65-crowded")]
    return [smallest_case().to("cuda"), smallest_case(reverse=True).to("cuda"), *built]


def judged(case: TopkCase, got: torch.Tensor, contract: TopkContract) -> dict[str, Any]:
    """The oracle's verdict on `got` and its headline."""
    comparison = compare_topk(reference(case, contract.nan), got, case, contract)
    return {"verdict": comparison.verdict.value, "headline": comparison.headline()}


def same_sets(got: torch.Tensor, expected: torch.Tensor) -> int:
    """Rows whose index set equals the expected row's."""
    return int((got.cpu().sort(dim=1).values == expected.sort(dim=1).values).all(dim=1).sum())


def stock_call(backend: SglangJitTopk, case: TopkCase, contract: TopkContract) -> torch.Tensor:
    """The adapter's call, as the run makes it."""
    return backend(encode_topk(case, contract), None)


def patched_call(module: Any, case: TopkCase, contract: TopkContract) -> torch.Tensor:
    """The patched module, called as the adapter calls the stock one."""
    inputs = encode_topk(case, contract)
    indices = inputs.logits.new_empty((inputs.rows, inputs.k), dtype=torch.int32)
    getattr(module, f"fast_topk_{inputs.k}")(inputs.logits, inputs.row_starts, indices, inputs.lengths)
    return indices


def check(case: TopkCase, backend: SglangJitTopk, patched: Any) -> dict[str, Any]:
    """Stock kernel (REPEATS launches) and patched kernel on one case, each against the oracle and the port."""
    contract, cpu = backend.contract, case.to("cpu")
    port, lifted = fast_topk(cpu), fast_topk(cpu, None)
    launches = [stock_call(backend, case, contract) for _ in range(REPEATS)]
    torch.cuda.synchronize()
    distinct = len({tuple(map(tuple, g.cpu().sort(dim=1).values.tolist())) for g in launches})
    result: dict[str, Any] = {
        "case": case.name, "rows": case.rows, "k": case.k, "window": int(case.window_lens()[0]),
        "stock": judged(case, launches[0], contract), "port": judged(cpu, port, contract),
        "stock_rows_equal_to_port": same_sets(launches[0], port), "stock_distinct_sets": distinct}
    if patched is not None:
        got = patched_call(patched, case, contract)
        result["patched"] = judged(case, got, contract)
        result["patched_rows_equal_to_lifted_port"] = same_sets(got, lifted)
    return result


def printed(result: dict[str, Any]) -> str:
    """The case's lines of the report."""
    lines = [f"{result['case']} [rows={result['rows']} k={result['k']} window {result['window']}]",
             f"  stock   {result['stock']['verdict']}: {result['stock']['headline']}",
             f"  port    {result['port']['verdict']}: {result['port']['headline']}",
             f"  stock = port on {result['stock_rows_equal_to_port']}/{result['rows']} rows; "
             f"{result['stock_distinct_sets']} distinct answer(s) over {REPEATS} launches"]
    if "patched" in result:
        lines += [f"  patched {result['patched']['verdict']}: {result['patched']['headline']}",
                  f"  patched = port with the limit lifted on {result['patched_rows_equal_to_lifted_port']}/"
                  f"{result['rows']} rows"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Build, run every case, print and write OUT/results.json; exit 1 when a stock answer differs from the
    port's or a patched answer fails."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    backend = SglangJitTopk(NAME)
    reason = backend.unavailable_reason("cuda")
    if reason:
        print(f"{NAME}: SKIP: {reason}")
        return 2
    start = time.monotonic()
    root = patched_sources(Path(tempfile.mkdtemp(prefix="fast_topk_patched_")))
    todo = cases()
    first_of_k = {case.k: case for case in reversed(todo)}
    with concurrent.futures.ThreadPoolExecutor(len(first_of_k) + 1) as pool:  # the adapter builds one module per k
        warm = [pool.submit(stock_call, backend, case, backend.contract) for case in first_of_k.values()]
        patched_build = pool.submit(build_patched, root)
        for future in warm:  # a failed build is retried by the adapter's next call (its lru_cache keeps none)
            if future.exception():
                print(f"stock build failed in parallel, retried at the first call: {future.exception()}")
        patched = None if patched_build.exception() else patched_build.result()
    print(f"builds: {time.monotonic() - start:.0f} s; patched sources: {root}"
          + (f"; patched build FAILED: {patched_build.exception()}" if patched is None else ""))
    results = []
    for case in todo:  # printed as they come: a case that raises is named and the others still run
        try:
            results.append(check(case, backend, patched))
            print(printed(results[-1]))
        except Exception as exc:  # a kernel or build error: the report names it
            results.append({"case": case.name, "error": f"{type(exc).__name__}: {exc}"})
            print(f"{case.name}: ERROR: {results[-1]['error']}")
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    faithful = all(r.get("stock_rows_equal_to_port") == r.get("rows") for r in results)
    fixed = patched is not None and all(r.get("patched", {}).get("verdict") == "PASS" for r in results)
    print(f"\nport reproduces the stock kernel's sets on every case: {faithful}; patched kernel PASS on every "
          f"case: {fixed}; {time.monotonic() - start:.0f} s")
    return 0 if faithful and fixed else 1


if __name__ == "__main__":
    sys.exit(main())
