"""A matrix suite with `op`: its cells run that operation's backends, planned from their own contracts."""

from __future__ import annotations

from pathlib import Path

from difftest.core.kinds import OperationKind
from difftest.core.verdict import Verdict
from difftest.matrix.cell import plan_matrix, run_cell
from difftest.matrix.definition import load_matrix

MATRIX = """
[matrix]
backends = ["torch", "torch-topk", "torch-topk-vllm", "vllm-persistent-topk"]

[matrix.devices.cpu]
runner = "ubuntu-latest"

[matrix.devices.sm90]
runner = ["self-hosted", "h200"]

[matrix.versions.installed]
backends = ["*"]

[matrix.suites.paged]
cases = "edges"

[matrix.suites.topk]
op = "topk"
cases = "random"
"""


def test_a_suite_with_op_topk_runs_the_topk_backends_in_its_cell(tmp_path: Path) -> None:
    path = tmp_path / "difftest.toml"
    path.write_text(MATRIX)
    matrix = load_matrix(path)
    assert {s.name: s.op for s in matrix.suites} == {"paged": OperationKind.PAGED_LOGITS, "topk": OperationKind.TOPK}
    cells = {cell.name: cell.backends for cell in plan_matrix(matrix).cells}
    assert cells["cpu/installed/topk"] == ("torch-topk", "torch-topk-vllm")  # the CUDA-only kernel: sm90 only
    assert cells["sm90/installed/topk"] == ("torch-topk", "torch-topk-vllm", "vllm-persistent-topk")
    assert cells["cpu/installed/paged"] == ("torch",)
    ran = run_cell(path, "cpu/installed/topk", tmp_path / "out")
    assert ran.results and {r.operation for r in ran.results} == {OperationKind.TOPK}
    assert {r.backend for r in ran.results} == {"torch-topk", "torch-topk-vllm"}
    assert not any(r.verdict.failed for r in ran.results) and any(r.verdict == Verdict.PASS for r in ran.results)
    assert ran.junit.is_file() and ran.report.is_file()
