"""CaseSpec: validation errors that name the field, and the JSON round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour
from difftest.generators import CaseSpec, LengthDist, Stale, Values
from difftest.generators.cases import default_specs, edge_cases


@pytest.mark.parametrize("spec", [CaseSpec(), *edge_cases(), *default_specs(),
                                  CaseSpec(lengths=(0, 3), padding=2, fp8=Fp8Flavour.E4M3FNUZ, values=Values.HEAVY,
                                           stale=Stale.ZERO, shared_blocks=True, extra_columns=1)],
                         ids=lambda s: s.name)
def test_to_json_from_json_roundtrip(spec):
    data = spec.to_json()
    assert all(isinstance(v, (str, int, bool, list, type(None))) for v in data.values()), f"{data=}"
    assert CaseSpec.from_json(data) == spec


@pytest.mark.parametrize("changes, field, expected_part", [
    (dict(batch=0), "batch", ">= 1"),
    (dict(next_n=0), "next_n", ">= 1"),
    (dict(heads=0), "heads", ">= 1"),
    (dict(head_dim=24), "head_dim", "multiple of 16"),
    (dict(head_dim=0), "head_dim", "multiple of 16"),
    (dict(block_size=0), "block_size", ">= 1"),
    (dict(max_model_len=0), "max_model_len", ">= 1"),
    (dict(padding=-1), "padding", ">= 0"),
    (dict(extra_columns=-2), "extra_columns", ">= 0"),
    (dict(canary_blocks=0), "canary_blocks", ">= 1"),
    (dict(lengths=()), "lengths", "at least one"),
    (dict(lengths=(3, -1)), "lengths", "[0, max_model_len = 256]"),
    (dict(lengths=(3, 257)), "lengths", "[0, max_model_len = 256]"),
])
def test_validate_names_the_field(changes, field, expected_part):
    spec = CaseSpec().replace(**changes)
    with pytest.raises(SpecError) as info:
        spec.validate()
    err = info.value
    (value,) = changes.values()
    assert (err.field, err.value) == (field, value), f"{err}"
    assert expected_part in err.expected and str(err).startswith(f"{field}="), f"{err}"


def test_from_json_rejects_unknown_fields_and_bad_values():
    with pytest.raises(SpecError) as info:
        CaseSpec.from_json({**CaseSpec().to_json(), "nxt_n": 2})
    assert info.value.field == "spec" and info.value.value == ["nxt_n"], f"{info.value}"
    with pytest.raises(SpecError) as info:
        CaseSpec.from_json({**CaseSpec().to_json(), "next_n": 0})
    assert info.value.field == "next_n", f"{info.value}"
    with pytest.raises(ValueError, match="'gaussian'"):
        CaseSpec.from_json({**CaseSpec().to_json(), "values": "gaussian"})


def test_total_batch_counts_padding():
    assert CaseSpec(batch=4, padding=2).total_batch == 6
    assert CaseSpec(batch=4, lengths=(1, 2, 3), padding=1).total_batch == 4


@given(st.builds(CaseSpec, name=st.text(min_size=1, max_size=12), batch=st.integers(1, 64),
                 next_n=st.integers(1, 8), heads=st.integers(1, 128), head_dim=st.sampled_from([16, 64, 128]),
                 block_size=st.sampled_from([1, 16, 64]), max_model_len=st.integers(1, 1 << 17),
                 length_dist=st.sampled_from(list(LengthDist)), values=st.sampled_from(list(Values)),
                 padding=st.integers(0, 4), shared_blocks=st.booleans(), stale=st.sampled_from(list(Stale)),
                 extra_columns=st.integers(0, 3), canary_blocks=st.integers(1, 4),
                 fp8=st.sampled_from(list(Fp8Flavour))))
def test_json_roundtrip_property(spec):
    assert CaseSpec.from_json(spec.to_json()) == spec
