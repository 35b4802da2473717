"""Consensus (`--oracle none`): masks against the true windows, values against a peer, a disagreement settled
by the metamorphic relations; the paths that need an oracle refuse to run without one."""

from __future__ import annotations

import json

import pytest

from difftest.backends import as_loaded, get_backends, mutants
from difftest.cli import main
from difftest.core.errors import SpecError
from difftest.core.kinds import OracleKind
from difftest.core.verdict import Verdict
from difftest.engine import consensus
from difftest.engine.config import RunConfig
from difftest.generators import CaseSpec, build_case
from difftest.oracles.reference import make_reference
from difftest.workflows import fuzz
from tests import planted

NONE = RunConfig(oracle=OracleKind.NONE)
CASE = CaseSpec(name="c", batch=3, next_n=2, max_model_len=64)


def _results(backends, spec=CASE):
    return {r.backend: r for r in consensus.run(backends, [build_case(spec, 0)], NONE)}


def test_the_side_the_relations_fault_fails_and_the_other_passes():
    torch_ref = get_backends(["torch"])[0]
    wrong = as_loaded(planted.draft_rows_reuse_weights)  # next_n > 1 rows weighted with row 0's weights
    results = _results([torch_ref, wrong, as_loaded(mutants.mutant("correct"))])
    assert results["planted-draft-weights"].verdict == Verdict.FAIL_VALUE
    assert "the relations fault planted-draft-weights (flatten-next-n)" in results["planted-draft-weights"].reason
    assert [v.relation.value for v in results["planted-draft-weights"].metamorphic] == ["flatten-next-n"]
    assert results["torch"].verdict == Verdict.PASS and "not torch" in results["torch"].reason
    assert results["mutant-correct"].verdict == Verdict.PASS
    assert results["mutant-correct"].reason == "values judged against torch"


def test_a_disagreement_no_relation_settles_fails_both_sides():
    """Decoding e4m3fn as e4m3fnuz quarters every logit, consistently: no relation faults either side."""
    results = _results([get_backends(["torch"])[0], as_loaded(mutants.mutant("fp8_fnuz"))])
    assert {r.verdict for r in results.values()} == {Verdict.FAIL_VALUE}
    assert all("the relations fault neither side" in r.reason for r in results.values())


def test_a_lone_backend_is_judged_on_its_masks():
    """Without a peer, the windows still say where -inf belongs: the dropped last key of a full block is
    FAIL(mask) with no oracle and no other backend."""
    spec = CaseSpec(name="m", lengths=(16, 32, 5), next_n=1, max_model_len=64)
    (result,) = _results([as_loaded(planted.block_boundary_off_by_one)], spec).values()
    assert result.verdict == Verdict.FAIL_MASK and result.comparison.mask_rows == [0, 1]
    assert result.reason.endswith("only the masks were judged")
    (alone,) = _results([get_backends(["torch"])[0]], spec).values()
    assert alone.verdict == Verdict.PASS


def test_run_without_an_oracle(tmp_path, capsys):
    report = tmp_path / "r.json"
    status = main(["run", "--backends", "torch,tests.planted:weights_of_next_head", "--oracle", "none", "--spec",
                   json.dumps({"name": "n", "batch": 2, "max_model_len": 64}), "--report", str(report)])
    out = capsys.readouterr().out
    assert status == 1, out
    assert "    consensus: disagrees with torch on values (rows [0, 1]...): the relations fault " in out
    results = {r["backend"]: r for r in json.loads(report.read_text())["results"]}
    assert results["torch"]["verdict"] == "PASS" and results["planted-weights-of-next-head"]["verdict"] == "FAIL(value)"
    assert json.loads(report.read_text())["run"]["oracle"] == "none"


def test_what_needs_an_oracle_refuses_none():
    with pytest.raises(SpecError, match="oracle='none'"):
        make_reference(build_case(CASE, 0), OracleKind.NONE)
    with pytest.raises(SpecError, match="oracle='none'"):
        fuzz.Campaign(budget=1.0, config=NONE)
