"""difftest.generators.envelope: edge cases derived from a contract's declared envelope, sized for a target.

CPU only and fast: the production-scale plans are checked as specs and footprints; only SMALL specs
(and one small pool with high block ids) are built.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import subprocess
import sys
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from difftest.core.contract import Contract, WorkingMemory, WorkPartition
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, Device, Fp8Flavour, LengthEncoding, MaskConvention, PartitionScope
from difftest.core.spec import CaseSpec, LengthDist
from difftest.generators import envelope
from difftest.generators.cases import default_specs, edge_cases, suite
from difftest.generators.envelope import (
    SMALL_MAX_CONTEXT,
    TWO_31,
    EdgeFamily,
    Omission,
    PlannedSpec,
    Scale,
    Target,
    claim_reason,
    envelope_key,
    envelope_specs,
    estimate_bytes,
    fit,
)
from difftest.generators.tensors import build_case
from tests.support import REPO_ROOT

GB = 10**9
H200 = Target.production_gpu(sms=132, memory_bytes=139 * GB)
SMALL = Target.small_cpu()


def contract(**envelope: object) -> Contract:
    """A contract that takes anything except what `envelope` declares."""
    return Contract(LengthEncoding.PER_ROW, CacheLayout.BLOCK_SPLIT, MaskConvention.TAIL_NEG_INF, **envelope)


# A kernel like DeepGEMM's on sm90, from its declared facts only.
GLOBAL_256 = WorkPartition(256, PartitionScope.GLOBAL, workers=None, halved_at_next_n=(4,))
DEEPGEMM_LIKE = contract(devices=("cuda",), next_n=(1, 2, 4), head_dims=(32, 64, 128), block_sizes=(64,),
                         tiles=(64, 256), max_context=131072, partition=GLOBAL_256)
# A kernel like AITER's Triton ones: block size 1, power-of-two heads, 5 programs per row over 64-token chunks.
AITER_LIKE = contract(block_sizes=(1,), head_dims=(32, 64, 128, 256), heads_power_of_two=True, max_pool_bytes=TWO_31,
                      tiles=(64,), partition=WorkPartition(64, PartitionScope.PER_ROW, workers=5))
OPEN = contract()
CONTRACTS = {"deepgemm-like": DEEPGEMM_LIKE, "aiter-like": AITER_LIKE, "open": OPEN}


def _plan(c: Contract, target: Target) -> tuple[list[PlannedSpec], list[Omission]]:
    return envelope_specs(c, target)


def _by_name(planned: list[PlannedSpec]) -> dict[str, PlannedSpec]:
    return {p.spec.name: p for p in planned}


def _with(planned: list[PlannedSpec], family: EdgeFamily) -> list[PlannedSpec]:
    return [p for p in planned if family in p.families]


# --------------------------------------------------------------------------- the envelope is respected

@pytest.mark.parametrize("target", [SMALL, H200], ids=lambda t: t.scale.value)
def test_a_backend_declaring_h64_block64_only_gets_only_such_cases(target):
    only = contract(heads=(64,), block_sizes=(64,))
    planned, omitted = _plan(only, target)
    assert planned, f"{omitted=}"
    wrong = [(p.spec.name, p.spec.heads, p.spec.block_size) for p in planned
             if (p.spec.heads, p.spec.block_size) != (64, 64)]
    assert not wrong, f"cases outside H = 64 / block 64: {wrong}"


@pytest.mark.parametrize("target", [SMALL, H200], ids=lambda t: t.scale.value)
@pytest.mark.parametrize("name", CONTRACTS)
def test_every_planned_spec_is_inside_the_envelope(name, target):
    c = CONTRACTS[name]
    planned, _ = _plan(c, target)
    for p in planned:
        s = p.spec.validate()
        assert c.shape_reason(s.next_n, s.heads, s.head_dim, s.block_size) is None, f"{s.name}: {s}"
        assert c.max_context is None or s.max_model_len <= c.max_context, f"{s.name}: {s.max_model_len=}"
        pool = estimate_bytes(s).pool_bytes
        assert c.max_pool_bytes is None or pool <= c.max_pool_bytes, f"{s.name}: {pool=}"
        assert estimate_bytes(s, c).total(target.device) <= target.memory_bytes, f"{s.name} does not fit"


def test_a_device_the_contract_excludes_gets_no_cases_and_says_why():
    planned, omitted = _plan(DEEPGEMM_LIKE, SMALL)
    assert planned == []
    assert {o.family for o in omitted} == set(EdgeFamily)
    assert all("exclude cpu" in o.reason for o in omitted), f"{omitted[0]=}"


@pytest.mark.parametrize("target", [SMALL, H200, Target.production_gpu(132, 2 * GB)], ids=["small", "h200", "2gb"])
@pytest.mark.parametrize("name", CONTRACTS)
def test_every_family_is_planned_or_omitted_with_a_reason(name, target):
    planned, omitted = _plan(CONTRACTS[name], target)
    reached = {f for p in planned for f in p.families}
    left_out = {o.family for o in omitted}
    assert reached | left_out == set(EdgeFamily), f"unaccounted: {set(EdgeFamily) - reached - left_out}"
    assert all(o.reason for o in omitted)
    names = [p.spec.name for p in planned]
    assert len(names) == len(set(names)), f"duplicate names {names}"


def test_every_supported_value_is_reached():
    planned, _ = _plan(DEEPGEMM_LIKE, H200)
    specs = [p.spec for p in planned]
    assert {s.next_n for s in specs} >= {1, 2, 4}
    assert {s.head_dim for s in specs} >= {32, 64, 128}
    assert {s.fp8 for s in specs} == set(Fp8Flavour)


# --------------------------------------------------------------------------- derived from declared facts

def _tile_lengths(planned: list[PlannedSpec]) -> set[int]:
    return {n for p in _with(planned, EdgeFamily.TILE_MULTIPLES) for n in p.spec.lengths}


def test_a_backend_with_a_different_split_size_gets_its_own_edges():
    split_512 = dataclasses.replace(DEEPGEMM_LIKE, tiles=(64, 512),
                                    partition=dataclasses.replace(GLOBAL_256, unit_tokens=512))
    a, _ = _plan(DEEPGEMM_LIKE, H200)
    b, _ = _plan(split_512, H200)
    assert {255, 256, 257, 511, 512, 513} <= _tile_lengths(a)
    assert {511, 512, 513, 1023, 1024, 1025} <= _tile_lengths(b) and 257 not in _tile_lengths(b)
    firsts = {p.spec.lengths[0] for p in _with(a, EdgeFamily.PARTITION_STRADDLE)}
    firsts_b = {p.spec.lengths[0] for p in _with(b, EdgeFamily.PARTITION_STRADDLE)}
    # 132 workers (66 at next_n 4) of 256- or 512-token units: a first request of exactly W units
    assert {131 * 256 + 1, 65 * 256 + 1} <= firsts and not {131 * 512 + 1, 65 * 512 + 1} & firsts
    assert {131 * 512 + 1, 65 * 512 + 1} <= firsts_b and not {131 * 256 + 1, 65 * 256 + 1} & firsts_b
    assert envelope_key(DEEPGEMM_LIKE) != envelope_key(split_512)


def test_tiles_128_and_256_give_different_lengths():
    lengths = {t: _tile_lengths(_plan(contract(tiles=(t,)), H200)[0]) for t in (128, 256)}
    # k = 1, 2 and the largest multiple under the 131072-token context
    assert {127, 128, 129, 255, 256, 257, 130943, 130944, 130945} <= lengths[128]
    assert {255, 256, 257, 511, 512, 513, 130815, 130816, 130817} <= lengths[256]
    assert not {511, 513, 130815, 130817} & lengths[128] and not {130943, 130945} & lengths[256]


def test_straddles_follow_the_target_sm_count():
    def firsts(sms: int) -> set[int]:
        planned, _ = _plan(DEEPGEMM_LIKE, Target.production_gpu(sms, 139 * GB))
        return {p.spec.lengths[0] for p in _with(planned, EdgeFamily.PARTITION_STRADDLE)}

    lengths = {sms: firsts(sms) for sms in (132, 78)}
    assert 131 * 256 + 1 in lengths[132] and 77 * 256 + 1 in lengths[78]


def _units(lengths: tuple[int, ...], unit: int) -> list[int]:
    """The request each unit of work belongs to, units of every request laid end to end."""
    return [b for b, n in enumerate(lengths) for _ in range(math.ceil(n / unit))]


def _ranges(total: int, workers: int, remainder_first: bool) -> list[tuple[int, int]]:
    """Contiguous near-equal ranges of `total` units over `workers`, the remainder at one end."""
    share, rest = divmod(total, workers)
    extra = [i < rest if remainder_first else i >= workers - rest for i in range(workers)]
    bounds = [0, *itertools.accumulate(share + e for e in extra)]
    return list(itertools.pairwise(bounds))


def _spans_an_empty_request(lengths: tuple[int, ...], unit: int, workers: int, remainder_first: bool) -> bool:
    owners = _units(lengths, unit)
    for lo, hi in _ranges(len(owners), workers, remainder_first):
        inside = owners[lo:hi]
        if inside and any(lengths[z] == 0 for z in range(inside[0] + 1, inside[-1])):
            return True
    return False


@pytest.mark.parametrize("remainder_first", [False, True], ids=["remainder-last", "remainder-first"])
def test_global_straddles_make_a_worker_range_span_the_empty_request(remainder_first):
    planned, _ = _plan(DEEPGEMM_LIKE, H200)
    straddles = _with(planned, EdgeFamily.PARTITION_STRADDLE)
    by_workers: dict[int, list[CaseSpec]] = {}
    for p in straddles:
        by_workers.setdefault(GLOBAL_256.worker_count(p.spec.next_n, H200.sms), []).append(p.spec)
    assert set(by_workers) == {132, 66}, f"{by_workers.keys()=}: next_n 4 halves the workers"
    for workers, specs in by_workers.items():
        hits = [s.name for s in specs if _spans_an_empty_request(s.lengths, 256, workers, remainder_first)]
        assert hits, f"no straddle spec makes one of {workers} ranges span an empty request"
        # the interleaved one does whichever end the remainder goes to
        assert any("interleaved" in h for h in hits), f"{hits=}"


def test_per_row_straddles_split_rows_unevenly_around_empty_chunks():
    planned, _ = _plan(AITER_LIKE, SMALL)
    (spec,) = [p.spec for p in _with(planned, EdgeFamily.PARTITION_STRADDLE)]
    programs, unit = 5, 64
    uneven = one_token_tail = 0
    for n in spec.lengths:
        units = math.ceil(n / unit)
        chunk = math.ceil(units / programs) if units else 0
        shares = [max(0, min(units, (i + 1) * chunk) - i * chunk) for i in range(programs)]
        uneven += units > 0 and 0 in shares
        one_token_tail += n % unit == 1
    assert uneven >= 2 and one_token_tail >= 2, f"{spec.lengths=}"
    assert 0 in spec.lengths


# --------------------------------------------------------------------------- scale families

def test_2_31_families_are_planned_where_memory_allows():
    planned, omitted = _plan(DEEPGEMM_LIKE, H200)
    named = _by_name(planned)
    under, over = named["pool-under-2^31-bytes"].spec, named["pool-over-2^31-bytes"].spec
    block_bytes = under.block_size * (under.head_dim + 4)
    assert estimate_bytes(under).pool_bytes <= TWO_31 < estimate_bytes(over).pool_bytes
    assert over.pool_blocks - under.pool_blocks == 1 and over.high_block_ids and under.high_block_ids
    # the top block (used, with high ids) starts below 2^31 and ends past it
    assert (over.pool_blocks - 1) * block_bytes < TWO_31 < over.pool_blocks * block_bytes
    lu, lo = named["logits-under-2^31"].spec, named["logits-over-2^31"].spec
    assert lu.total_batch * lu.next_n * lu.max_model_len <= TWO_31 < lo.total_batch * lo.next_n * lo.max_model_len
    assert lo.lengths[-1] > 0 and lo.max_model_len == DEEPGEMM_LIKE.max_context
    token_keys = {EdgeFamily.TOKEN_KEY_2_31_BYTES, EdgeFamily.TOKEN_KEY_2_32_BYTES}
    assert {o.family for o in omitted} == token_keys, f"{omitted=}: a block-split layout has no token * row stride"
    assert all("block-split" in o.reason for o in omitted), f"{omitted=}"
    for name in ("positions-32768", "positions-65536"):
        assert max(named[name].spec.lengths) in (2**15 + 2, 2**16 + 2)


def test_2_31_families_are_omitted_with_the_numbers_when_memory_is_short():
    planned, omitted = _plan(DEEPGEMM_LIKE, Target.production_gpu(132, 16 * GB))
    reasons = {o.family: o.reason for o in omitted}
    assert EdgeFamily.LOGITS_2_31_ELEMENTS in reasons
    assert "GB logits" in reasons[EdgeFamily.LOGITS_2_31_ELEMENTS] and "16.0 GB allowed" in \
        reasons[EdgeFamily.LOGITS_2_31_ELEMENTS], reasons[EdgeFamily.LOGITS_2_31_ELEMENTS]
    assert "pool-over-2^31-bytes" in _by_name(planned), "a 2^31-byte pool fits 16 GB"
    planned, omitted = _plan(DEEPGEMM_LIKE, Target.production_gpu(132, 2 * GB))
    assert EdgeFamily.POOL_2_31_BYTES in {o.family for o in omitted}
    assert not _with(planned, EdgeFamily.POOL_2_31_BYTES), "a 2^31 case is never shrunk into a small one"


def test_a_contract_pool_limit_keeps_the_under_case_and_omits_the_over_case():
    planned, omitted = _plan(AITER_LIKE, H200)
    assert "pool-under-2^31-bytes" in _by_name(planned)
    over = [o for o in omitted if o.spec_name == "pool-over-2^31-bytes"]
    assert over and "max_pool_bytes 2147483648" in over[0].reason, f"{omitted=}"


def test_small_scale_omits_what_needs_scale_and_says_why():
    _, omitted = _plan(AITER_LIKE, SMALL)
    reasons = {o.family: o.reason for o in omitted}
    for family in (EdgeFamily.POOL_2_31_BYTES, EdgeFamily.LOGITS_2_31_ELEMENTS, EdgeFamily.POSITIONS_2_15,
                   EdgeFamily.POSITIONS_2_16):
        assert "SMALL scale keeps" in reasons[family], f"{family}: {reasons.get(family)}"


def test_a_global_partition_over_sms_is_omitted_on_a_cpu_target():
    cpu_too = dataclasses.replace(DEEPGEMM_LIKE, devices=("cpu", "cuda"))
    _, omitted = _plan(cpu_too, SMALL)
    (straddle,) = [o for o in omitted if o.family == EdgeFamily.PARTITION_STRADDLE]
    assert "SMs" in straddle.reason


def test_production_plan_is_production_shaped():
    planned, _ = _plan(OPEN, H200)
    specs = [p.spec for p in planned]
    base = _by_name(planned)["random-mtp1-uniform"].spec
    assert (base.heads, base.head_dim, base.block_size) == (64, 128, 64)
    assert max(s.max_model_len for s in specs) >= 131072
    assert max(s.total_batch for s in specs if s.lengths is None) == 128


# --------------------------------------------------------------------------- SMALL mirrors the toy list

def test_small_plan_of_an_open_contract_holds_the_toy_edges_and_default_specs():
    """Field for field, except max-model-len: it goes to the envelope's longest context (for a contract that
    names none, the longest SMALL scale draws), with the overhang column past it."""
    planned, _ = _plan(OPEN, SMALL)
    named = _by_name(planned)
    toy = [*edge_cases(), *default_specs()]
    assert not {s.name for s in toy} - set(named)
    assert {s for s in toy if s.name != "max-model-len"} <= {p.spec for p in planned}, "the toy specs, field for field"
    (full,) = [s for s in toy if s.name == "max-model-len"]
    assert named["max-model-len"].spec == full.replace(max_model_len=SMALL_MAX_CONTEXT, extra_columns=1)
    assert named["max-model-len"].families == (EdgeFamily.MAX_CONTEXT,)
    assert named["mtp-overhang-column"].families == (EdgeFamily.STALE_TABLES,), "128 is not the longest context"


@pytest.mark.parametrize("name", ["aiter-like", "open"])
def test_a_small_plan_costs_no_more_kernel_work_than_the_toy_suite(name):
    """The CPU's interpreted kernels take time per row and per key read (~0.2 s per row and 64 keys for
    AITER's fused kernel on 2 cores): a SMALL plan, once per spec, stays under today's suite."""
    def cost(specs: list[CaseSpec]) -> tuple[int, int]:
        return sum(estimate_bytes(s).key_reads for s in specs), sum(s.total_batch * s.next_n for s in specs)

    planned, _ = _plan(CONTRACTS[name], SMALL)
    reads, rows = cost([p.spec for p in planned])
    toy_reads, toy_rows = cost([s for s, _ in suite("all")])
    assert reads <= toy_reads and rows <= toy_rows, f"{reads=} {rows=} vs the toy suite's {toy_reads=} {toy_rows=}"


def test_small_specs_build_on_cpu_quickly():
    start = time.perf_counter()
    for c in (AITER_LIKE, OPEN, contract(heads=(64,), block_sizes=(64,))):
        planned, _ = _plan(c, SMALL)
        for index, p in enumerate(planned):
            case = build_case(p.spec, index)
            fp = estimate_bytes(p.spec)
            assert case.pool_bytes <= fp.pool_bytes, f"{p.spec.name}: the estimate is an upper bound"
            if p.spec.lengths is not None:
                assert case.pool_bytes == fp.pool_bytes, p.spec.name
            assert fp.logits_bytes == case.rows * case.max_model_len * 4
    assert time.perf_counter() - start < 30, "SMALL specs should build in seconds"


# --------------------------------------------------------------------------- pools and high block ids

def test_a_set_pool_with_high_ids_puts_used_blocks_on_top_and_canaries_below():
    spec = CaseSpec(lengths=(33, 16, 1, 0), next_n=2, pool_blocks=600, high_block_ids=True, heads=4)
    case = build_case(spec, 3)
    used_count = 3 + 1 + 1
    used = case.block_table[torch.arange(case.block_table.shape[1])[None, :] < case.used_blocks()[:, None]]
    assert case.k_pool.shape[0] == 600
    assert sorted(used.tolist()) == list(range(600 - used_count, 600))
    below = case.k_values()[: 600 - used_count]
    assert below.isnan().all() and case.scale_pool[: 600 - used_count].isnan().all()
    stale = case.block_table[~(torch.arange(case.block_table.shape[1])[None, :] < case.used_blocks()[:, None])]
    assert (stale < 600 - used_count).all(), "stale entries point at canaries below the used blocks"
    again = build_case(spec, 3)
    assert torch.equal(case.k_pool, again.k_pool) and torch.equal(case.block_table, again.block_table)


def test_a_set_pool_without_high_ids_scatters_used_blocks_over_the_whole_pool():
    spec = CaseSpec(lengths=(160, 160), pool_blocks=4000)
    case = build_case(spec, 0)
    assert case.k_pool.shape[0] == 4000 and int(case.block_table.max()) > 100


def test_pool_fields_validate_and_roundtrip():
    spec = CaseSpec(lengths=(33, 1), pool_blocks=70_000, high_block_ids=True)
    assert CaseSpec.from_json(spec.to_json()) == spec
    assert "pool_blocks" not in CaseSpec().to_json() and "high_block_ids" not in CaseSpec().to_json()
    with pytest.raises(SpecError) as info:
        CaseSpec(lengths=(33, 1), pool_blocks=3).validate()
    assert info.value.field == "pool_blocks" and "at least 6" in info.value.expected, f"{info.value}"
    with pytest.raises(SpecError):  # drawn lengths may use every column
        CaseSpec(batch=2, max_model_len=64, block_size=16, pool_blocks=9).validate()


# --------------------------------------------------------------------------- footprints and fit

def test_footprint_parts():
    spec = CaseSpec(lengths=(100, 0), next_n=2, heads=8, head_dim=64, block_size=16, max_model_len=128)
    fp = estimate_bytes(spec)
    assert fp.pool_bytes == (7 + 2) * 16 * 68
    assert fp.logits_bytes == 4 * 128 * 4 and fp.oracle_fused_bytes >= fp.logits_bytes
    assert fp.oracle_cpu_bytes >= 2 * fp.logits_bytes  # float64
    assert fp.key_reads == 99 + 100
    assert fp.oracle_bytes(Device.CPU) > fp.oracle_bytes(Device.CUDA)
    assert fp.total(Device.CPU) >= fp.total(Device.CUDA) > fp.case_bytes
    repaged = estimate_bytes(spec, contract(block_sizes=(1,)))
    assert repaged.kernel_bytes > fp.kernel_bytes


# A backend whose call holds per-head fp32 scores besides its logits, as AITER's stage1 callers do.
HOLDS_H_FOLD = contract(working_memory=WorkingMemory(bytes_per_logit_per_head=4))


def test_the_footprint_counts_the_working_memory_a_contract_declares():
    spec = CaseSpec(lengths=(100, 0), next_n=2, heads=8, head_dim=64, block_size=16, max_model_len=131072)
    plain, held = estimate_bytes(spec), estimate_bytes(spec, HOLDS_H_FOLD)
    logits = 4 * 131072  # rows * max_model_len
    assert (plain.working_bytes, held.working_bytes) == (0, 8 * 4 * logits)
    assert held.total(Device.CUDA) - plain.total(Device.CUDA) == held.working_bytes
    assert f"{held.working_bytes / 1e6:.1f} MB kernel working memory" in held.describe(Device.CUDA)
    per_logit = estimate_bytes(spec, contract(working_memory=WorkingMemory(bytes_per_logit=2)))
    assert per_logit.working_bytes == 2 * logits


def test_a_backend_holding_h_times_the_logits_leaves_the_2_31_logits_family_out_with_the_numbers():
    """What an H-fold buffer does to the 2^31-logit cases on an H200: 550 GB at H = 64 fits no GPU, so
    the family is an Omission that names the bytes; the same envelope without it keeps both cases."""
    planned, _ = _plan(OPEN, H200)
    kept = {p.spec.name: p.spec for p in _with(planned, EdgeFamily.LOGITS_2_31_ELEMENTS)}
    assert set(kept) == {"logits-under-2^31", "logits-over-2^31"}, f"{kept=}"
    planned, omitted = _plan(HOLDS_H_FOLD, H200)
    assert not _with(planned, EdgeFamily.LOGITS_2_31_ELEMENTS)
    reasons = {o.spec_name: o.reason for o in omitted if o.family == EdgeFamily.LOGITS_2_31_ELEMENTS}
    for name, spec in kept.items():
        fp = estimate_bytes(spec, HOLDS_H_FOLD)
        assert fp.working_bytes == 4 * spec.heads * spec.total_batch * spec.next_n * spec.max_model_len > 500 * GB
        for shown in (f"needs {fp.total(Device.CUDA) / GB:.1f} GB", f"{fp.working_bytes / GB:.1f} GB kernel working "
                      "memory", "139.0 GB allowed and shrinking it would lose what it tests"):
            assert shown in reasons[name], f"{name}: {shown!r} not in {reasons[name]!r}"
    assert envelope_key(HOLDS_H_FOLD) != envelope_key(OPEN), "the two plan different cases"


def test_fit_shrinks_a_drawn_case_and_says_what_changed():
    planned = PlannedSpec(CaseSpec(name="big", batch=128, next_n=2, heads=64, head_dim=128, block_size=64,
                                   max_model_len=131072), (EdgeFamily.RANDOM,))
    need = estimate_bytes(planned.spec).total(Device.CUDA)
    fitted = fit(planned, need // 5)
    assert isinstance(fitted, PlannedSpec) and fitted.spec.batch < 128 and fitted.spec.max_model_len == 131072
    assert "batch 128 -> " in fitted.shrunk and "allowed" in fitted.shrunk
    tiny = fit(planned, 64 * 10**6)
    assert isinstance(tiny, PlannedSpec) and tiny.spec.max_model_len < 131072, "contexts shrink last"


def test_fit_never_shrinks_what_a_family_is_about():
    logits = PlannedSpec(CaseSpec(name="logits", lengths=(1,) * 4096, next_n=4, max_model_len=131072,
                                  block_size=64), (EdgeFamily.LOGITS_2_31_ELEMENTS,))
    result = fit(logits, 10 * GB)
    assert isinstance(result, Omission) and result.family == EdgeFamily.LOGITS_2_31_ELEMENTS
    assert "10.0 GB allowed" in result.reason and "lose what it tests" in result.reason
    full = PlannedSpec(CaseSpec(name="full", batch=64, length_dist=LengthDist.FULL, max_model_len=131072,
                                heads=64, head_dim=128, block_size=64), (EdgeFamily.MAX_CONTEXT,))
    shrunk = fit(full, estimate_bytes(full.spec.replace(batch=4)).total(Device.CUDA))
    assert isinstance(shrunk, PlannedSpec) and shrunk.spec.max_model_len == 131072 and shrunk.spec.batch == 4


# --------------------------------------------------------------------------- grouping

def test_backends_with_the_same_envelope_share_a_key_and_a_plan():
    flattened = dataclasses.replace(DEEPGEMM_LIKE, length_encoding=LengthEncoding.FLATTENED, rtol=0.5)
    assert envelope_key(flattened) == envelope_key(DEEPGEMM_LIKE)
    assert _plan(flattened, H200) == _plan(DEEPGEMM_LIKE, H200)
    reordered = dataclasses.replace(DEEPGEMM_LIKE, next_n=(4, 2, 1))
    assert envelope_key(reordered) == envelope_key(DEEPGEMM_LIKE)
    assert envelope_key(dataclasses.replace(DEEPGEMM_LIKE, heads=(64,))) != envelope_key(DEEPGEMM_LIKE)


def test_target_scale_defaults():
    assert SMALL.scale == Scale.SMALL and SMALL.device == Device.CPU and SMALL.sms == 0
    probed = Target.probe(Device.CPU)
    assert probed.scale == Scale.SMALL and probed.memory_bytes > 0


# --------------------------------------------------------------------------- unaligned and offset families

def test_unaligned_max_model_lens_end_inside_a_partial_last_tile_of_the_declared_tiles():
    """DeepGEMM-like tiles 64 and 256 (lcm 256) at a 131072-token context: max_model_len one past, one short
    of and 64 past a multiple of 256, each row's last tile followed by a row with keys."""
    planned, _ = _plan(DEEPGEMM_LIKE, H200)
    specs = [p.spec for p in _with(planned, EdgeFamily.UNALIGNED_MAX_MODEL_LEN)]
    assert sorted(s.max_model_len for s in specs) == [130817, 130880, 131071], [s.name for s in specs]
    for s in specs:
        whole = s.max_model_len - s.max_model_len % 256
        assert whole < s.max_model_len == max(s.lengths) and min(s.lengths) <= whole, f"{s.name}: {s.lengths=}"
        assert all(n > 64 for n in s.lengths[1:]), "every row after one has keys at the spilled positions"
    small = {p.spec.max_model_len for p in _with(_plan(AITER_LIKE, SMALL)[0], EdgeFamily.UNALIGNED_MAX_MODEL_LEN)}
    assert small == {65, 127}, "64-token chunks, at toy scale"


@pytest.mark.parametrize("tiles", [(48,), (64, 96), (80,)])
def test_unaligned_lengths_follow_whatever_tiles_are_declared(tiles):
    planned, _ = _plan(contract(tiles=tiles, block_sizes=(16,)), H200)
    step = math.lcm(16, *tiles)
    rests = {p.spec.max_model_len % step for p in _with(planned, EdgeFamily.UNALIGNED_MAX_MODEL_LEN)}
    assert rests == {1, step - 1, *(t for t in (16, *tiles) if t < step)}, f"{rests=}"


def test_an_unaligned_pool_is_prime_past_the_tiles_with_its_last_block_used():
    for c in (DEEPGEMM_LIKE, AITER_LIKE, OPEN):
        for target in (SMALL, H200):
            for p in _with(_plan(c, target)[0], EdgeFamily.UNALIGNED_POOL):
                blocks = p.spec.pool_blocks
                assert blocks > 256 if c is DEEPGEMM_LIKE else blocks > 16
                assert all(blocks % d for d in range(2, math.isqrt(blocks) + 1)) and p.spec.high_block_ids
                case = build_case(p.spec.replace(heads=4), 0) if target is SMALL else None
                if case is not None:
                    assert int(case.block_table.max()) == blocks - 1, "the pool's last block is a used one"


def _used_block_starts(spec: CaseSpec, fed: int) -> list[int]:
    """Byte offsets at which the blocks a drawn case's sequences use start, as fed (tokens where fed is 1)."""
    lengths = spec.lengths
    per = spec.block_size // fed
    used = sum(-(-n // spec.block_size) for n in lengths)
    block_bytes = fed * (spec.head_dim + 4)
    return [i * block_bytes for i in range((spec.pool_blocks - used) * per, spec.pool_blocks * per)]


@pytest.mark.parametrize(("name", "fed"), [("deepgemm-like", 64), ("aiter-like-unbounded", 1)])
def test_block_bases_start_just_under_and_just_past_2_31_and_2_32(name, fed):
    """The block-split cache's block id * block * (D + 4) bytes, at the block size the kernel is fed (a
    block-size-1 kernel's blocks are tokens: token index * (D + 4) of its token-interleaved layout)."""
    c = DEEPGEMM_LIKE if fed == 64 else dataclasses.replace(AITER_LIKE, max_pool_bytes=None,
                                                              cache_layout=CacheLayout.TOKEN_INTERLEAVED)
    named = _by_name(_plan(c, H200)[0])
    for limit, power in ((TWO_31, 31), (2**32, 32)):
        under, past = named[f"block-base-under-2^{power}-bytes"], named[f"block-base-past-2^{power}-bytes"]
        block = fed * (under.spec.head_dim + 4)
        assert under.spec.block_size == past.spec.block_size == fed
        assert all(n % fed == 0 for n in under.spec.lengths), "every used block full"
        top = max(_used_block_starts(under.spec, fed))
        assert limit - block <= top < limit < top + block, "the top used block starts just under the limit"
        low = min(_used_block_starts(past.spec, fed))
        assert limit <= low < limit + block, "the lowest used block starts just past it"
        for p in (under, past):
            family = EdgeFamily(f"block-base-2^{power}-bytes")
            assert family in p.families and EdgeFamily.HIGH_BLOCK_IDS in p.families
            assert (EdgeFamily(f"token-key-2^{power}-bytes") in p.families) == (fed == 1), p.families


def test_block_split_tokens_have_no_row_stride_and_int32_products_past_2_32_wrap_onto_canaries():
    """The past-2^32 pool's used blocks sit above canaries, so a product wrapped mod 2^32 lands on one."""
    named = _by_name(_plan(DEEPGEMM_LIKE, H200)[0])
    past = named["block-base-past-2^32-bytes"].spec
    block = past.block_size * (past.head_dim + 4)
    wrapped = [start % 2**32 for start in _used_block_starts(past, past.block_size)]
    lowest_used = min(_used_block_starts(past, past.block_size))
    assert all(w + block <= lowest_used for w in wrapped), "a wrapped offset reads below the used blocks: NaN"


@pytest.mark.parametrize("family", [EdgeFamily.LOGITS_ROW_2_31_BYTES, EdgeFamily.LOGITS_ROW_2_32_BYTES,
                                    EdgeFamily.LOGITS_ROW_2_31_ELEMENTS, EdgeFamily.LOGITS_ROW_2_32_ELEMENTS,
                                    EdgeFamily.Q_ROW_2_31_BYTES, EdgeFamily.Q_ROW_2_32_BYTES])
@pytest.mark.parametrize("output", [torch.float32, torch.bfloat16])
def test_row_families_start_a_row_with_keys_just_under_and_one_just_past_the_limit(family, output):
    c = dataclasses.replace(DEEPGEMM_LIKE, output_dtype=output)
    (p,) = _with(_plan(c, H200)[0], family)
    s = p.spec
    limit = 2**31 if "2^31" in family.value else 2**32
    unit = s.heads * s.head_dim if family.value.startswith("q-") else \
        s.max_model_len * (output.itemsize if family.value.endswith("bytes") else 1)
    rows = s.total_batch * s.next_n
    starts = [r * unit for r in range(rows)]
    limits = [max(s.lengths[r // s.next_n] - s.next_n + r % s.next_n + 1, 0) for r in range(rows)]
    under = [r for r in range(rows) if limit - unit <= starts[r] < limit and limits[r] > 0]
    past = [r for r in range(rows) if limit <= starts[r] < limit + unit and limits[r] > 0]
    assert under and past, f"{s.name}: {rows=} {unit=}"
    assert rows * unit < limit + 2 * unit + s.next_n * unit, "no more rows than reaching the limit takes"


def test_a_declared_max_batch_leaves_out_the_cases_that_hand_more_requests_with_the_reason():
    """DeepGEMM's sm90 metadata kernel holds one uint32 per request in shared memory: 58112 at most. The q-row
    families need 2^31 q bytes of rows (B = 65537 at H 64, D 128, next_n 4): left out, the limit named; a
    flattened encoding hands B * next_n requests."""
    native = dataclasses.replace(DEEPGEMM_LIKE, max_batch=58112)
    planned, omitted = _plan(native, H200)
    assert all(p.spec.total_batch <= 58112 for p in planned)
    reasons = {o.family: o.reason for o in omitted}
    assert "requests in one call exceed the contract's max_batch 58112" in reasons[EdgeFamily.Q_ROW_2_31_BYTES]
    flat = dataclasses.replace(native, length_encoding=LengthEncoding.FLATTENED, next_n=None)
    assert all(p.spec.total_batch * p.spec.next_n <= 58112 for p in _plan(flat, H200)[0])
    assert native.limits_reason(1024, 0, 58113, 4) == "58113 requests in one call exceed the contract's max_batch 58112"
    assert flat.limits_reason(1024, 0, 14529, 4) == "58116 requests in one call exceed the contract's max_batch 58112"
    assert native.limits_reason(1024, 0, 58112, 4) is None


def test_offset_families_are_left_out_at_small_scale_with_the_numbers():
    _, omitted = _plan(OPEN, SMALL)
    reasons = {o.family: o.reason for o in omitted}
    for family in (EdgeFamily.BLOCK_BASE_2_31_BYTES, EdgeFamily.BLOCK_BASE_2_32_BYTES):
        assert "GB pool; SMALL scale keeps pools <= 250.0 MB" in reasons[family], reasons[family]
    for family in (EdgeFamily.LOGITS_ROW_2_31_ELEMENTS, EdgeFamily.LOGITS_ROW_2_32_BYTES):
        assert "logits; SMALL scale keeps rows * max_model_len <= 4194304" in reasons[family], reasons[family]
    assert "GB q; SMALL scale keeps q <= " in reasons[EdgeFamily.Q_ROW_2_31_BYTES], reasons[EdgeFamily.Q_ROW_2_31_BYTES]
    assert "block-split" in reasons[EdgeFamily.TOKEN_KEY_2_31_BYTES]


# --------------------------------------------------------------------------- the small scale honours the envelope

@pytest.mark.parametrize(("declared", "longest"), [(1024, 1024), (300, 300), (None, SMALL_MAX_CONTEXT),
                                                   (4096, None)])
def test_small_max_context_cases_reach_the_declared_longest_context(declared, longest):
    """A backend declaring max_context 1024 gets 1024-token cases on the CPU; one declaring more than SMALL
    scale draws is told so, with the numbers, rather than handed a shorter case called max-context."""
    planned, omitted = _plan(contract(max_context=declared), SMALL)
    reaching = _with(planned, EdgeFamily.MAX_CONTEXT)
    if longest is None:
        assert not reaching
        reasons = [o.reason for o in omitted if o.family == EdgeFamily.MAX_CONTEXT]
        assert reasons[0] == "max-context-4096: needs max_model_len 4096; SMALL scale keeps contexts <= 1024 for a " \
            "CPU run", reasons
        assert all("4096" in r for r in reasons), reasons
        return
    assert {p.spec.name for p in reaching} == {"max-model-len"}
    for p in reaching:
        assert p.spec.max_model_len == longest and max(_lengths(p.spec)) == longest, p.spec
        case = build_case(p.spec.replace(heads=4), 0)
        assert int(case.seq_lens.max()) == longest and case.block_table.shape[1] >= longest // 16


def _lengths(spec: CaseSpec) -> tuple[int, ...]:
    return spec.lengths or (spec.max_model_len,) * spec.batch


# --------------------------------------------------------------------------- every claim holds

@pytest.mark.parametrize("name", CONTRACTS)
def test_what_a_claim_reads_of_a_spec_is_what_its_drawn_case_has(name):
    """claim_reason judges a spec by its lengths (explicit, or all max_model_len when full) and, for a set
    pool with high ids, by the used blocks taking its top ids: the drawn cases have exactly those."""
    for index, p in enumerate(_plan(CONTRACTS[name], SMALL)[0]):
        spec = p.spec.replace(heads=4)  # the claims read no head count; fewer heads draw faster
        case = build_case(spec, index)
        if spec.lengths is not None or spec.length_dist == LengthDist.FULL:
            assert tuple(case.lengths) == (*_lengths(spec), *(0,) * spec.padding), spec.name
        if spec.pool_blocks is not None and spec.high_block_ids:
            columns = torch.arange(case.block_table.shape[1])[None, :] < case.used_blocks()[:, None]
            used = sorted(set(case.block_table[columns].tolist()))
            assert used == list(range(spec.pool_blocks - len(used), spec.pool_blocks)), spec.name


def test_a_claim_a_case_does_not_reach_is_refused_with_the_reason():
    at_128 = CaseSpec(name="full-128", batch=2, length_dist=LengthDist.FULL, max_model_len=128)
    reason = claim_reason(EdgeFamily.MAX_CONTEXT, at_128, contract(max_context=1024), SMALL)
    assert "128" in reason and "longest context 1024" in reason, reason
    drawn = at_128.replace(max_model_len=1024, length_dist=LengthDist.UNIFORM)
    assert "drawn lengths" in claim_reason(EdgeFamily.MAX_CONTEXT, drawn, contract(max_context=1024), SMALL)
    aligned = CaseSpec(lengths=(128, 127), max_model_len=128)
    assert claim_reason(EdgeFamily.UNALIGNED_MAX_MODEL_LEN, aligned, contract(tiles=(64,)), SMALL)
    low_pool = CaseSpec(lengths=(64, 64), block_size=64, head_dim=128, pool_blocks=300_000, high_block_ids=True)
    assert "2^32" in claim_reason(EdgeFamily.BLOCK_BASE_2_32_BYTES, low_pool, OPEN, H200)
    assert claim_reason(EdgeFamily.BLOCK_BASE_2_31_BYTES, low_pool.replace(lengths=(63, 64)), OPEN, H200), \
        "a partly used block: which slots reach past the limit depends on the draw"


@settings(deadline=None)
@given(tiles=st.lists(st.integers(2, 512), min_size=0, max_size=3),
       block=st.sampled_from([1, 16, 32, 64]), context=st.integers(4096, 1 << 18), unit=st.integers(1, 1024),
       small=st.booleans())
def test_any_declared_envelope_plans_only_claims_its_cases_reach(tiles, block, context, unit, small):
    """Whatever tiles, block size, context and partition unit a contract declares, every family is reached
    or left out with a reason, no case passes the context, and the unaligned cases are unaligned to the
    tiles' lcm. (Contexts from 4096: at a shorter one the 2^31 row families list a million requests,
    seconds per plan.)"""
    c = contract(tiles=tuple(tiles), block_sizes=(block,), max_context=context,
                 partition=WorkPartition(unit, PartitionScope.PER_ROW, workers=4))
    target = SMALL if small else H200
    planned, omitted = _plan(c, target)
    assert all(p.spec.max_model_len <= context for p in planned)
    assert {f for p in planned for f in p.families} | {o.family for o in omitted} == set(EdgeFamily)
    kernel_tiles = {t for t in (*tiles, unit, block) if t > 1}
    longest = min(context, SMALL_MAX_CONTEXT) if small else context
    step = math.lcm(*kernel_tiles) if math.lcm(*kernel_tiles) <= longest else max(kernel_tiles)
    for p in _with(planned, EdgeFamily.UNALIGNED_MAX_MODEL_LEN):
        assert p.spec.max_model_len % step, f"{p.spec.name}: a multiple of the tiles' lcm {step}"


# --------------------------------------------------------------------------- planted kernels

def _planted(name: str) -> Contract:
    from tests.gpu_broken_backends import TritonInt32BlockBase, TritonLastTileSpill

    return {"spill": TritonLastTileSpill, "int32": TritonInt32BlockBase}[name].contract


def test_the_planted_kernels_families_are_planned_in_the_production_envelope():
    """scripts/device_visit.sh planted-edges: the last-tile spill meets max_model_len ending inside a block (the
    kernel's tile), the int32 block base a used block starting past 2^31 and past 2^32 bytes."""
    spill = _by_name(_plan(_planted("spill"), H200)[0])
    unaligned = [p.spec for p in spill.values() if EdgeFamily.UNALIGNED_MAX_MODEL_LEN in p.families]
    assert any(s.block_size == 64 and s.max_model_len % 64 and s.max_model_len > 100_000 for s in unaligned), \
        [(s.name, s.block_size) for s in unaligned]
    int32 = _by_name(_plan(_planted("int32"), H200)[0])
    for power in (31, 32):
        spec = int32[f"block-base-past-2^{power}-bytes"].spec
        assert min(_used_block_starts(spec, spec.block_size)) >= 2**power and spec.block_size == 64
        assert spec.heads == 64 and spec.head_dim == 128, "the production shape"
    top = max(_used_block_starts(int32["pool-over-2^31-bytes"].spec, 64))
    assert top < TWO_31, "the old family crossed 2^31 only inside its top block, never at a block's start"


SPILL_INTERPRETED = """
import dataclasses
from difftest.engine.comparison import compare
from difftest.core.kernel_inputs import encode
from difftest.oracles.reference import make_reference
from difftest.generators import build_case
from difftest.generators.envelope import EdgeFamily, Target, envelope_specs
from tests.gpu_broken_backends import TritonGood, TritonLastTileSpill

contract = dataclasses.replace(TritonLastTileSpill.contract, devices=("cpu", "cuda"))
for p in envelope_specs(contract, Target.small_cpu())[0]:
    if {EdgeFamily.UNALIGNED_MAX_MODEL_LEN, EdgeFamily.TILE_MULTIPLES} & set(p.families):
        case = build_case(p.spec, 0)
        ref = make_reference(case)
        for kernel in (TritonGood(), TritonLastTileSpill()):
            got = kernel(encode(case, kernel.contract), None)
            verdict = compare(ref.logits, got, ref.row_lens, kernel.contract, ref.bound).verdict.value
            print(p.spec.name, p.spec.max_model_len, p.spec.block_size, kernel.name, verdict)
"""


def test_the_last_tile_spill_is_caught_on_the_cpu_by_the_unaligned_family_alone():
    """Under the Triton interpreter at toy scale (block 16): FAIL where max_model_len ends inside a block,
    PASS where it is a multiple of 16 and on every tile-multiples case; the control passes everywhere."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([sys.executable, "-c", SPILL_INTERPRETED], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [line.split() for line in done.stdout.splitlines()]
    assert lines, done.stdout + done.stderr
    for name, max_model_len, block, kernel, verdict in lines:
        spills = kernel == "triton-last-tile-spill" and int(max_model_len) % int(block) != 0
        assert verdict == ("FAIL(mask)" if spills else "PASS"), (name, kernel, verdict)
    assert any(line[0].startswith("unaligned") and line[-1] == "FAIL(mask)" for line in lines)
    assert all(line[-1] == "PASS" for line in lines if line[0].startswith("tile-")), "aligned cases cannot see it"


def test_a_block_64_only_contract_plans_the_block_id_families_on_the_cpu():
    """DeepGEMM's block 64 alone: high-block-ids and unaligned-pool were left out ('lengths=(129, 64, 1, 0):
    expected every length in [0, max_model_len = 128]'); their max_model_len now holds their lengths."""
    on_cpu = dataclasses.replace(DEEPGEMM_LIKE, devices=("cpu", "cuda"))
    planned, omitted = _plan(on_cpu, SMALL)
    for family in (EdgeFamily.HIGH_BLOCK_IDS, EdgeFamily.UNALIGNED_POOL):
        [case] = _with(planned, family)
        assert case.spec.block_size == 64 and max(case.spec.lengths) <= case.spec.max_model_len, case.spec
        assert not [o for o in omitted if o.family == family], [o for o in omitted if o.family == family]


def test_a_planner_bug_raises_instead_of_leaving_a_family_out(monkeypatch):
    """A spec the planner builds that describes no case is the planner's bug: an error, never a 'left out'."""
    def broken(plan):
        return [PlannedSpec(plan.spec("broken", 1, lengths=(plan.base.max_model_len + 1,)), (EdgeFamily.RANDOM,))]

    monkeypatch.setattr(envelope, "_BUILDERS", (broken,))
    with pytest.raises(AssertionError, match="the planner built broken, which describes no case: lengths="):
        _plan(OPEN, SMALL)


def test_a_declared_head_dim_no_spec_takes_is_still_left_out_with_its_reason():
    planned, omitted = _plan(contract(head_dims=(24,)), SMALL)
    assert not planned and any("head_dim" in o.reason and "multiple of 16" in o.reason for o in omitted), omitted
