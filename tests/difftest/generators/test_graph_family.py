"""The replay family of --graph (difftest.generators.graph_family): every replay a valid case of the captured
buffers' shapes, each step's lengths as it says, the same family drawn twice, names that map back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from difftest.generators import build_case
from difftest.generators.graph_family import (
    FAMILY,
    ReplayStep,
    captured,
    captured_name,
    replay_family,
    replay_name,
    step_lengths,
)
from difftest.generators.strategies import specs
from tests.support import TINY

TENSORS = ("q", "k_pool", "scale_pool", "weights", "block_table", "seq_lens")


@settings(max_examples=30, deadline=None)
@given(spec=specs(max_batch=4, heads=(1, 2), head_dims=(16,), block_sizes=(16, 1, 5), max_model_len=40),
       seed=st.integers(0, 2**16))
def test_every_replay_is_a_valid_case_with_the_captured_buffers_shapes(spec, seed):
    case = build_case(spec, seed)
    base = captured(case)
    assert base.block_table.shape[1] * base.block_size >= base.max_model_len, "the table holds max_model_len"
    family = replay_family(case)
    assert [r.meta["graph_replay"] for r in family] == [step.value for step in FAMILY]
    for replay in family:
        replay.validate()
        assert replay.max_model_len == case.max_model_len and replay.fp8 == case.fp8
        for name in TENSORS:
            ours, theirs = getattr(replay, name), getattr(base, name)
            assert (ours.shape, ours.dtype) == (theirs.shape, theirs.dtype), name


@given(lengths=st.lists(st.integers(0, 64), min_size=1, max_size=6), block_size=st.sampled_from([1, 16, 64]))
def test_each_step_moves_the_lengths_as_it_says(lengths, block_size):
    captured_lengths, longest = tuple(lengths), 64
    grown = step_lengths(captured_lengths, ReplayStep.GROW, longest, block_size)
    assert all(g >= c for g, c in zip(grown, captured_lengths, strict=True)) and max(grown) == longest
    shrunk = step_lengths(captured_lengths, ReplayStep.SHRINK, longest, block_size)
    assert all(s <= c and (s > 0) == (c > 0) for s, c in zip(shrunk, captured_lengths, strict=True))
    emptied = step_lengths(captured_lengths, ReplayStep.ZERO_LENGTH, longest, block_size)
    assert emptied[0] == 0 and emptied[1::2] == captured_lengths[1::2]
    assert step_lengths(captured_lengths, ReplayStep.REMAPPED, longest, block_size) == captured_lengths


def test_the_same_case_draws_the_same_family_and_its_blocks_move():
    case = build_case(TINY.replace(max_model_len=64, block_size=4, lengths=(30, 9, 17)), 2)
    first, again = replay_family(case), replay_family(case)
    assert all(a.q.equal(b.q) and a.block_table.equal(b.block_table) for a, b in zip(first, again, strict=True))
    remapped = first[FAMILY.index(ReplayStep.REMAPPED)]
    assert remapped.lengths == case.lengths and not remapped.block_table.equal(captured(case).block_table)
    assert not remapped.q.equal(case.q), "every replay writes fresh values"


def test_a_replay_name_maps_back_to_its_captured_case():
    assert replay_name("edges-s3", 2) == "edges-s3@replay2"
    assert captured_name("edges-s3@replay2") == "edges-s3" and captured_name("edges-s3") == "edges-s3"
