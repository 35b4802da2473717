"""The mutants' kernel under the Triton interpreter: the correct one computes the oracle on every shape of the
production envelope, each mutant plants its own bug and no other, and a template's envelope is taken."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.backends import load_backend, mutants
from difftest.core.contract import Contract, WorkPartition
from difftest.core.kernel_inputs import encode
from difftest.core.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention, PartitionScope
from difftest.core.spec import LengthDist, Stale, Values
from difftest.core.triton_interpret import environ, load_kernel_module
from difftest.core.verdict import Verdict
from difftest.engine.comparison import compare
from difftest.generators import CaseSpec, build_case
from difftest.oracles.reference import make_reference

# The production envelope's shape (H 64, D 128, block 64, next_n 1-4) and the small one's, with what the
# mutants' bugs need: empty requests inside the batch, stale canary columns, heavy values, e4m3fnuz bytes.
SHAPES = [CaseSpec(name="deepseek", batch=3, next_n=4, heads=64, head_dim=128, block_size=64, max_model_len=256,
                   length_dist=LengthDist.EDGES),
          CaseSpec(name="toy", lengths=(33, 0, 16, 1), next_n=2, max_model_len=96, extra_columns=1, stale=Stale.CANARY),
          CaseSpec(name="heavy", batch=2, next_n=3, values=Values.HEAVY, block_size=1, max_model_len=64),
          CaseSpec(name="fnuz", batch=2, next_n=1, fp8=Fp8Flavour.E4M3FNUZ, max_model_len=64)]


def _verdicts(key: str) -> list[Verdict]:
    kernel = mutants.mutant(key)
    out = []
    for spec in SHAPES:
        case = build_case(spec, 5)
        ref = make_reference(case)
        out.append(compare(ref.logits, kernel(encode(case, kernel.contract), None), ref.row_lens, kernel.contract,
                           ref.bound).verdict)
    return out


def test_the_kernels_switches_are_the_mutation_enum():
    kernels = load_kernel_module(mutants.KERNEL_FILE, "difftest_mutant_kernel", interpret=True)
    assert {m.name: m.value for m in mutants.Mutation} == {
        m.name: getattr(kernels, m.name).value for m in mutants.Mutation}


@pytest.mark.parametrize("key", ["correct", "rotated_head_sum"])
def test_the_kernels_that_must_pass_compute_the_oracle(key):
    assert _verdicts(key) == [Verdict.PASS] * len(SHAPES)


@pytest.mark.parametrize("spec", [s for s in mutants.KERNELS if s.production_only], ids=lambda s: s.key)
def test_a_production_only_mutant_is_right_below_its_scale(spec):
    """Its bug needs 2^31 bytes, 2^31 logits or 2^15 positions: below them it is the correct kernel."""
    assert _verdicts(spec.key) == [Verdict.PASS] * len(SHAPES)


@pytest.mark.parametrize("spec", [s for s in mutants.KERNELS if not s.production_only and not s.must_pass],
                         ids=lambda s: s.key)
def test_every_other_mutant_is_wrong_on_some_small_case(spec):
    assert any(v.failed for v in _verdicts(spec.key))


def test_the_rotated_head_sum_moves_bits_from_launch_to_launch():
    kernel = mutants.mutant("rotated_head_sum")
    inputs = encode(build_case(SHAPES[1], 0), kernel.contract)
    first, second = kernel(inputs, None), kernel(inputs, None)
    finite = torch.isfinite(first)
    assert not torch.equal(first[finite], second[finite])
    assert torch.equal(finite, torch.isfinite(second))


def test_the_mutants_take_a_templates_envelope():
    template = Contract(LengthEncoding.PER_SEQUENCE, CacheLayout.TOKEN_INTERLEAVED, MaskConvention.TAIL_UNSPECIFIED,
                        rtol=5e-3, devices=("cuda",), next_n=(1, 2), block_sizes=(64,), head_dims=(96, 128),
                        heads=(64,), max_context=4096, tiles=(32, 256),
                        partition=WorkPartition(256, PartitionScope.GLOBAL))
    contract = mutants.envelope_of(template)
    # The kernel's interface stays: per-row limits, block-split e4m3fn, both devices.
    assert (contract.length_encoding, contract.cache_layout, contract.fp8, contract.devices) == (
        LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, Fp8Flavour.E4M3FN, ("cpu", "cuda"))
    assert (contract.mask, contract.rtol, contract.next_n, contract.block_sizes, contract.heads) == (
        MaskConvention.TAIL_UNSPECIFIED, 5e-3, (1, 2), (64,), (64,))
    assert contract.head_dims == (128,) and contract.heads_multiple_of == 16  # what the kernel compiles
    assert (contract.max_context, contract.partition, mutants.tile_of(contract)) == (4096, template.partition, 32)
    unmet = {s.key: mutants.unmet(s, contract) for s in mutants.KERNELS}
    assert unmet["window_past_end"] == ["the tail judged (mask tail-neg-inf): the contract's mask is tail-unspecified"]
    assert unmet["mirrored_window"] == [] and unmet["after_empty"] == []
    narrow = mutants.envelope_of(dataclasses.replace(template, next_n=(1,), heads=(16,)))
    assert mutants.unmet(mutants.BY_KEY["mirrored_window"], narrow) == [
        "draft rows (next_n >= 2): the contract takes next_n [1]"]
    assert mutants.unmet(mutants.BY_KEY["head_group_weights"], narrow) == [
        "more than 16 heads (a second head group): the contract takes heads [16]"]


def test_a_worker_rebuilds_a_mutant_in_the_templates_envelope():
    assert load_backend("difftest.backends.mutants:after_empty").backend.contract == mutants.envelope_of(None)
    with environ(mutants.TEMPLATE_ENV, "tests.planted:block_boundary_off_by_one"):
        rebuilt = load_backend("difftest.backends.mutants:after_empty").backend
    assert rebuilt.name == "mutant-after-empty" and rebuilt.contract.devices == ("cpu", "cuda")
    assert rebuilt.contract.library.endswith("in the envelope of tests.planted")


def test_a_mutant_on_the_gpu_without_one_says_why():
    kernel = mutants.mutant("correct")
    assert kernel.unavailable_reason("cpu") is None
    if not torch.cuda.is_available():
        assert kernel.unavailable_reason("cuda") is not None
