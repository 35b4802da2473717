"""The fused oracle's logits kernel compiled for sm90 on this machine, GPU or not, and what the compiler made
of it: registers and local memory (spills) from the cubin (cuobjdump, shipped with Triton), shared memory,
and in its key loop (the scf.for holding the tensor-core products) the shared-memory loads, layout
conversions and reductions each tile pays. Kernel changes can be judged here before the GPU times them.

    python3 scripts/fused_kernel_report.py --out reports/sm90-offline/fused-kernel-report.md
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a plain checkout

import triton

from difftest.core.spec import CaseSpec
from difftest.generators.tensors import build_case
from difftest.oracles.fused import compiled_offline, default_config

# The indexer's shape (H 64, D 128) at the bench's three next_n, on the tile-copy path (block 64) and the
# gather path (block 1).
SHAPES = [(next_n, block) for block in (64, 1) for next_n in (1, 2, 4)]


def _cuobjdump(cubin: bytes, option: str) -> str:
    """What Triton's cuobjdump prints for the cubin with `option` (-res-usage, -sass)."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as handle:
        handle.write(cubin)
    try:
        return subprocess.run([str(tool), option, handle.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(handle.name)


def resources(cubin: bytes) -> dict[str, int]:
    """REG, STACK, SHARED (static), LOCAL of the kernel, as cuobjdump -res-usage prints them."""
    out = _cuobjdump(cubin, "-res-usage")
    return {key: int(value) for key, value in re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", out)}


def sass_loop(cubin: bytes) -> list[str]:
    """The SASS of the key loop: the shortest span from a backward branch's target to the branch that holds
    the first tensor-core product (HGMMA)."""
    code = [(int(address, 16), text) for address, text in
            re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", _cuobjdump(cubin, "-sass"))]
    first = next((address for address, text in code if "HGMMA" in text), None)
    spans = [(int(target.group(1), 16), address) for address, text in code
             if (target := re.search(r"\bBRA\s+(?:`\(\S+\)\s+)?0x([0-9a-f]+)", text))]
    loops = [(start, end) for start, end in spans if first is not None and start <= first < end]
    if not loops:
        return []
    start, end = min(loops, key=lambda span: span[1] - span[0])
    return [text for address, text in code if start <= address <= end]


def _opcode(instruction: str) -> str:
    return re.sub(r"^@!?U?P\w+\s+", "", instruction).split()[0].split(".")[0]


def key_loop(ttgir: str) -> str:
    """The TTGIR of the loop over key tiles: from the scf.for whose body holds a warp_group_dot to its yield."""
    lines = ttgir.splitlines()
    for start, line in enumerate(lines):
        if "scf.for" in line:
            body = []
            for later in lines[start:]:
                body.append(later)
                if "scf.yield" in later:
                    break
            if any("warp_group_dot " in b for b in body):
                return "\n".join(body)
    return ""


def report(next_n: int, block: int) -> dict[str, object]:
    spec = CaseSpec(name="report", batch=2, next_n=next_n, heads=64, head_dim=128, block_size=block,
                    max_model_len=4096)
    case = build_case(spec, 0)
    compiled = compiled_offline(case)
    loop = key_loop(compiled.asm["ttgir"])
    sass = [_opcode(instruction) for instruction in sass_loop(compiled.asm["cubin"])]
    config = default_config(case, interpret=False)
    return {"next_n": next_n, "block": block, "maxnreg": config.maxnreg, **resources(compiled.asm["cubin"]),
            "dynamic_shared": compiled.metadata.shared, "loop_local_loads": loop.count("ttg.local_load"),
            "loop_convert_layouts": loop.count("ttg.convert_layout"), "loop_reduces": loop.count('"tt.reduce"'),
            "loop_dots": loop.count("warp_group_dot "), "sass_loop": len(sass),
            "sass_loop_spills": sass.count("STL") + sass.count("LDL"), "sass_loop_barriers": sass.count("BAR")}


def markdown(rows: list[dict[str, object]]) -> str:
    head = ["next_n", "block", "maxnreg", "REG", "LOCAL", "STACK", "dynamic_shared", "loop_dots", "loop_local_loads",
            "loop_convert_layouts", "loop_reduces", "sass_loop", "sass_loop_spills", "sass_loop_barriers"]
    lines = [f"The fused oracle's kernel (H 64, D 128, default config) compiled for sm90 offline, Triton "
             f"{triton.__version__}. LOCAL/STACK: bytes a thread keeps in local memory (spills, wherever in the "
             "kernel); loop_*: TTGIR ops in the key-tile loop, each paid every tile unless the backend merges them "
             "(at block 64, the key tile's two local_loads, one per product, compile to one set of loads); "
             "sass_loop*: that loop in the cubin, its instructions, its local-memory loads and stores (spills paid "
             "every tile) and its barriers (BAR: all four warps wait for each other).", "",
             "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(str(row.get(k)) for k in head) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    text = markdown([report(next_n, block) for next_n, block in SHAPES])
    print(text, end="")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
