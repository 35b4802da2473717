"""difftest.generators.envelope: edge cases derived from a contract's declared envelope, sized for a target.

CPU only and fast: the production-scale plans are checked as specs and footprints; only SMALL specs
(and one small pool with high block ids) are built.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time

import pytest
import torch

from difftest.core.contract import Contract, WorkingMemory, WorkPartition
from difftest.core.errors import SpecError
from difftest.core.kinds import CacheLayout, Device, Fp8Flavour, LengthEncoding, MaskConvention, PartitionScope
from difftest.generators.cases import default_specs, edge_cases, suite
from difftest.generators.envelope import (
    TWO_31,
    EdgeFamily,
    Omission,
    PlannedSpec,
    Scale,
    Target,
    envelope_key,
    envelope_specs,
    estimate_bytes,
    fit,
)
from difftest.generators.spec import CaseSpec, LengthDist
from difftest.generators.tensors import build_case

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
    assert {o.family for o in omitted} == set(), f"{omitted=}"
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
    planned, _ = _plan(OPEN, SMALL)
    missing = {s.name for s in [*edge_cases(), *default_specs()]} - {p.spec.name for p in planned}
    assert not missing
    specs = {p.spec for p in planned}
    assert set(edge_cases()) | set(default_specs()) <= specs, "the toy specs, field for field"


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
