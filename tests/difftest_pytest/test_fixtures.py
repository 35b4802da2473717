"""difftest_backend, difftest_case and difftest_seed, and the difftest marker that restricts them."""

from __future__ import annotations

import pytest

CHECK_TEST = """
import difftest

def test_k(difftest_backend, difftest_case):
    result = difftest.check(difftest_backend, difftest_case)
    assert result.verdict.value == "PASS" and result.comparison.mask_rows == []
"""


def test_fixtures_parametrize_backends_by_cases(planted: pytest.Pytester) -> None:
    planted.makepyfile(CHECK_TEST)
    result = planted.runpytest_inprocess("--co", "-q", "--difftest-seed=0",
                                         "--difftest-backends=torch,planted:off_by_one")
    result.stdout.fnmatch_lines(["*::test_k[[]torch-all-padding]", "*::test_k[[]torch-length-one]",
                                 "*::test_k[[]off-by-one-deepseek-heads]", "28 tests collected*"])


def test_check_passes_and_returns_the_result(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(CHECK_TEST)
    result = pytester.runpytest_inprocess("--difftest-backends=torch", "-k", "length-one or block-boundaries")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["torch: 0/14 rows with the wrong -inf mask"])


def test_random_cases_take_a_count(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(CHECK_TEST)
    result = pytester.runpytest_inprocess("--co", "-q", "--difftest-backends=torch", "--difftest-cases=random:1",
                                          "--difftest-seed=0")
    result.stdout.fnmatch_lines(["*[[]torch-random-mtp1-uniform]", "*[[]torch-random-mtp4-edges]",
                                 "4 tests collected*"])


def test_a_backend_that_cannot_run_here_is_skipped_with_its_reason(planted: pytest.Pytester) -> None:
    planted.makepyfile(CHECK_TEST)
    result = planted.runpytest_inprocess("-rs", "--difftest-backends=planted:cuda_only", "-k", "length-one")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["SKIPPED [[]1] *: cuda-only declares devices [[]'cuda'], not cpu"])


def test_the_marker_restricts_backends_and_copies_cases_per_next_n(planted: pytest.Pytester) -> None:
    planted.makepyfile("""
        import pytest

        @pytest.mark.difftest(backends=["torch"], next_n=[1, 3])
        def test_k(difftest_backend, difftest_case):
            assert difftest_case.next_n in (1, 3)
    """)
    result = planted.runpytest_inprocess("-v", "--difftest-seed=0", "--difftest-backends=torch,planted:off_by_one",
                                         "-k", "block-boundaries")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*::test_k[[]torch-block-boundaries-mtp1] PASSED*",
                                 "*::test_k[[]torch-block-boundaries-mtp3] PASSED*"])


@pytest.mark.parametrize(("marker", "message"), [
    ("backend='torch'", "difftest marker: ['backend']: expected keyword arguments among ['backends', 'next_n']"),
    ("backends=['triton-nope']", "difftest marker: backends=['triton-nope']: ['triton-nope'] are not registered "
                                 "(registered: ["),
    ("next_n=0", "difftest marker: next_n=(0,): expected integers >= 1"),
])
def test_a_misused_marker_fails_collection(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(f"""
        import pytest

        @pytest.mark.difftest({marker})
        def test_k(difftest_backend, difftest_case):
            pass
    """)
    result = pytester.runpytest_inprocess("--difftest-backends=torch")
    result.assert_outcomes(errors=1)
    assert message in result.stdout.str()


def test_the_seed_fixture_is_the_header_seed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        def test_seed(difftest_seed):
            assert difftest_seed == 31
    """)
    pytester.runpytest_inprocess("--difftest-seed=31").assert_outcomes(passed=1)


def test_ids_carry_no_seed_so_last_failed_reruns_exactly_the_failed_items(planted: pytest.Pytester) -> None:
    planted.makepyfile(CHECK_TEST)
    args = ["--difftest-backends=torch,planted:off_by_one", "-k", "length-one or all-padding"]
    planted.runpytest_inprocess(*args, "--difftest-seed=1").assert_outcomes(passed=3, failed=1)
    result = planted.runpytest_inprocess(*args, "--difftest-seed=2", "--lf", "-v")
    result.assert_outcomes(failed=1)  # and no other test ran
    result.stdout.fnmatch_lines(["run-last-failure: rerun previous 1 failure*",
                                 "*::test_k[[]off-by-one-length-one] FAILED*"])


def test_several_seeds_of_one_spec_are_numbered(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(CHECK_TEST)
    result = pytester.runpytest_inprocess("--co", "-q", "--difftest-backends=torch", "--difftest-cases=random:2",
                                          "-k", "mtp1")
    result.stdout.fnmatch_lines(["*[[]torch-random-mtp1-uniform-0]", "*[[]torch-random-mtp1-uniform-1]",
                                 "2/8 tests collected*"])


def test_the_fixtures_take_the_cases_and_backends_of_another_operation(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(CHECK_TEST.replace('and result.comparison.mask_rows == []', ''))
    args = ["--difftest-op=topk", "--difftest-backends=torch-topk,torch-topk-vllm", "--difftest-seed=0"]
    collected = pytester.runpytest_inprocess("--co", "-q", *args)
    collected.stdout.fnmatch_lines(["*::test_k[[]torch-topk-random-ragged-k512]",
                                    "*::test_k[[]torch-topk-vllm-random-decode-k2048]", "12 tests collected*"])
    result = pytester.runpytest_inprocess("-rs", *args, "-k", "decode-k512")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["torch-topk: 0/4 rows select a wrong set (0 tokens)"])


def test_next_n_copies_only_the_paged_cases(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("""
        import pytest

        @pytest.mark.difftest(next_n=[2])
        def test_k(difftest_case):
            pass
    """)
    result = pytester.runpytest_inprocess("--difftest-op=topk")
    result.assert_outcomes(errors=1)
    assert "difftest marker: next_n=[2]: copies the fixed paged-logits cases only (not topk edges cases)" in \
        result.stdout.str()


def test_envelope_cases_are_planned_inside_each_paged_contract(planted: pytest.Pytester) -> None:
    planted.makepyfile(mtp1="""
        import dataclasses

        import difftest
        from planted import CONTRACT


        @difftest.backend(dataclasses.replace(CONTRACT, next_n=(1,), block_sizes=(16,)), name="mtp1-only")
        def mtp1_only(q, kv_cache, weights, context_lens, block_table, max_model_len):
            raise AssertionError("collected only")
    """)
    planted.makepyfile(CHECK_TEST)
    result = planted.runpytest_inprocess("--co", "-q", "--difftest-cases=envelope",
                                         "--difftest-backends=torch,mtp1:mtp1_only")
    ids = [line.partition("[")[2].rstrip("]") for line in result.stdout.lines if "::test_k[" in line]
    torch_ids = [i for i in ids if i.startswith("torch-")]
    mine = [i.removeprefix("mtp1-only-") for i in ids if i.startswith("mtp1-only-")]
    assert {"torch-random-mtp2-edges", "torch-block-size-64"} <= set(torch_ids), ids
    assert mine and not any("mtp2" in i or "mtp3" in i or "mtp4" in i or "block-size-64" in i for i in mine), mine
    assert len(ids) == len(torch_ids) + len(mine)
