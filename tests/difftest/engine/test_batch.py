"""Batch.validate: the merged case and every member, in one pass, with the errors each member's own
validate() raises; joined: members' oracle shares laid end to end are the oracle's answer for them merged."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from difftest.core.errors import SpecError
from difftest.core.kinds import OracleKind
from difftest.core.spec import CaseSpec
from difftest.engine.batch import joined, merge
from difftest.generators.tensors import build_case
from difftest.oracles.reference import make_reference
from tests.support import TINY

SHAPE = dict(heads=4, head_dim=16, block_size=4, next_n=2)


def _pair() -> list:
    """A short member and a longer one: the batch's max_model_len and table width are the second's."""
    return [build_case(CaseSpec(name="short", batch=2, max_model_len=12, lengths=(5, 12), **SHAPE), 0),
            build_case(CaseSpec(name="long", batch=2, max_model_len=40, lengths=(33, 40), **SHAPE), 1)]


def _refused_as_alone(bad, *others) -> SpecError:
    """The SpecError of validating `bad` merged with `others`: the one `bad` raises alone."""
    with pytest.raises(SpecError) as alone:
        bad.validate()
    with pytest.raises(SpecError) as caught:
        merge([bad, *others]).validate()
    assert str(caught.value) == str(alone.value)
    return caught.value


def test_a_batch_of_valid_members_validates():
    batch = merge(_pair())
    assert batch.validate() is batch


def test_a_length_past_its_own_max_model_len_is_refused_though_the_batch_allows_it():
    short, long = _pair()
    bad = dataclasses.replace(short, max_model_len=10)  # its longest request is 12; the batch's limit is 40
    assert "max_model_len = 10" in str(_refused_as_alone(bad, long))


def test_a_block_id_in_the_next_members_pool_is_refused_though_the_merged_pool_has_it():
    short, long = _pair()
    stray = short.block_table.clone()
    stray[0, 0] = short.k_pool.shape[0]  # one past its own pool: the long member's first block once merged
    assert _refused_as_alone(dataclasses.replace(short, block_table=stray), long).field == "block_table"


def test_a_table_too_narrow_for_its_own_lengths_is_refused_though_the_widened_one_is_wide_enough():
    short, long = _pair()
    narrow = dataclasses.replace(short, block_table=short.block_table[:, :2])  # 8 positions for a length of 12
    assert _refused_as_alone(narrow, long).field == "block_table.shape"


def test_member_shapes_that_only_add_up_in_the_batch_are_refused():
    short, long = _pair()
    # One weights row moved from the long member to the short one: the merged weights have the right rows.
    bad = dataclasses.replace(short, weights=torch.cat([short.weights, long.weights[:1]]))
    assert _refused_as_alone(bad, dataclasses.replace(long, weights=long.weights[1:])).field == "weights.shape"


@pytest.mark.parametrize("oracle", [OracleKind.EXACT, OracleKind.FAST])
def test_members_shares_joined_are_the_oracles_answer_for_those_members_merged(oracle):
    members = [*_pair(), build_case(CaseSpec(name="mid", batch=3, max_model_len=20, lengths=(0, 20, 7), **SHAPE), 2)]
    batch = merge(members)
    ref = make_reference(batch.case, oracle)
    chosen = [2, 0]  # not in batch order: a retry launch takes the failures in any order
    again = merge([members[i] for i in chosen]).case
    got = joined([batch.reference_of(ref, i) for i in chosen], again.max_model_len)
    want = make_reference(again, oracle)
    assert got.logits.shape == want.logits.shape == (again.rows, 20)
    assert torch.equal(got.logits, want.logits) and torch.equal(got.row_lens, want.row_lens)
    assert torch.equal(got.bound, want.bound) and (got.oracle, got.next_n) == (want.oracle, want.next_n)


def test_a_merged_case_knows_the_lengths_its_members_know():
    members = [build_case(TINY.replace(batch=len(lens), lengths=lens), seed)
               for seed, lens in enumerate([(3, 0), (9,), (0, 5, 1)])]
    assert merge(members).case.known_lengths == (3, 0, 9, 0, 5, 1)
    unread = [dataclasses.replace(m, name=f"u{i}") for i, m in enumerate(members)]
    assert merge(unread).case.known_lengths is None
