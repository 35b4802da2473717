"""Bad input, fuzzed: malformed cases, tensors, backends, outputs and command lines each get one clear
error naming the field and what it expects (SpecError; exit 2 with one line), never a traceback."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from difftest.backends.torch_ref import TorchBackend
from difftest.backends.user import FunctionBackend, backend
from difftest.core.case import Case
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.core.verdict import Verdict
from difftest.engine.config import RunConfig
from difftest.engine.runner import run
from difftest.generators import build_case
from difftest.generators.strategies import specs
from tests import broken_backends as bb
from tests.support import TINY, run_cli

BASE = build_case(TINY.replace(next_n=2, lengths=(7, 20, 0)), 0)
TENSORS = ("q", "k_pool", "scale_pool", "weights", "block_table", "seq_lens")


def _visible_slot(case: Case) -> tuple[int, int]:
    """(block, slot) of the first key of the first sequence: a key some row sees."""
    return int(case.block_table[0, 0]), 0


def _with_scale(case: Case, value: float) -> dict[str, object]:
    scales = case.scale_pool.clone()
    scales[_visible_slot(case)] = value
    return {"scale_pool": scales}


def _with_block(case: Case, value: int) -> dict[str, object]:
    table = case.block_table.clone()
    table[0, 0] = value
    return {"block_table": table}


# (what is broken, the changes, the field the error must name)
CORRUPTIONS = [
    *[(f"{name} is None", {name: None}, name) for name in TENSORS],
    *[(f"{name} is a numpy array", {name: getattr(BASE, name).numpy()}, name) for name in TENSORS],
    *[(f"{name} on meta", {name: getattr(BASE, name).to("meta")}, f"{name}.device") for name in TENSORS[1:]],
    ("everything on meta", {name: getattr(BASE, name).to("meta") for name in TENSORS}, "q.device"),
    ("q float32", {"q": BASE.q.float()}, "q.dtype"),
    ("q as float8", {"q": BASE.q.view(torch.float8_e4m3fn)}, "q.dtype"),
    ("q 3-d", {"q": BASE.q[0]}, "q.shape"),
    ("D not a multiple of 16", {"q": BASE.q[..., :8], "k_pool": BASE.k_pool[..., :8]}, "D"),
    ("k_pool float", {"k_pool": BASE.k_pool.float()}, "k_pool.dtype"),
    ("k_pool D differs from q", {"k_pool": torch.cat([BASE.k_pool, BASE.k_pool], -1)}, "k_pool.shape"),
    ("scale_pool float64", {"scale_pool": BASE.scale_pool.double()}, "scale_pool.dtype"),
    ("scale_pool shape", {"scale_pool": BASE.scale_pool[:, :1]}, "scale_pool.shape"),
    ("weights float64", {"weights": BASE.weights.double()}, "weights.dtype"),
    ("weights transposed shape", {"weights": BASE.weights.t()}, "weights.shape"),
    ("weights NaN", {"weights": BASE.weights.clone().fill_(float("nan"))}, "weights"),
    ("weights inf", {"weights": BASE.weights.clone().fill_(float("inf"))}, "weights"),
    ("block_table float", {"block_table": BASE.block_table.float()}, "block_table.dtype"),
    ("block_table int16", {"block_table": BASE.block_table.short()}, "block_table.dtype"),
    ("block_table 1-d", {"block_table": BASE.block_table.reshape(-1)}, "block_table.shape"),
    ("seq_lens float", {"seq_lens": BASE.seq_lens.float()}, "seq_lens.dtype"),
    ("seq_lens 2-d", {"seq_lens": BASE.seq_lens[:, None]}, "seq_lens.shape"),
    ("negative length", {"seq_lens": BASE.seq_lens - 8}, "seq_lens"),
    ("length past max_model_len", {"seq_lens": BASE.seq_lens + 100}, "seq_lens"),
    ("length past the table", {"block_table": BASE.block_table[:, :2]}, "block_table.shape"),
    ("max_model_len 0", {"max_model_len": 0}, "max_model_len"),
    ("max_model_len float", {"max_model_len": 20.0}, "max_model_len"),
    ("max_model_len str", {"max_model_len": "20"}, "max_model_len"),
    ("max_model_len bool", {"max_model_len": True}, "max_model_len"),
    ("fp8 as a string", {"fp8": "e4m3fn"}, "fp8"),
    ("name not a string", {"name": 3}, "name"),
]


@pytest.mark.parametrize("what, changes, field", CORRUPTIONS, ids=[c[0] for c in CORRUPTIONS])
def test_malformed_case_names_the_field(what, changes, field):
    broken = dataclasses.replace(BASE, **changes)
    with pytest.raises(SpecError) as info:
        broken.validate()
    assert info.value.field == field, f"{what}: {info.value}"
    assert "expected" in str(info.value)
    with pytest.raises(SpecError):  # the runner validates what it is handed
        run([TorchBackend()], [broken], RunConfig())


@settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(max_batch=3, heads=(2,), head_dims=(16,), block_sizes=(4, 1), max_model_len=24),
       seed=st.integers(0, 2**16), value=st.sampled_from([0.0, -1.0, -0.5, float("nan"), float("inf")]),
       block=st.sampled_from([-1, 10**6]))
def test_fuzzed_bad_scales_and_block_ids_are_spec_errors(spec, seed, value, block):
    case = build_case(spec, seed)
    if int(case.seq_lens[0]) == 0:
        return  # the first sequence sees no key: nothing it reads can be bad
    with pytest.raises(SpecError) as scale_error:
        dataclasses.replace(case, **_with_scale(case, value)).validate()
    assert scale_error.value.field == "scale_pool", f"{scale_error.value}"
    with pytest.raises(SpecError) as block_error:
        dataclasses.replace(case, **_with_block(case, block)).validate()
    assert block_error.value.field == "block_table", f"{block_error.value}"


@settings(max_examples=25, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(max_batch=3, heads=(2, 4), head_dims=(16,), block_sizes=(4, 1), max_model_len=24),
       seed=st.integers(0, 2**16), field=st.sampled_from(("q", "k_pool", "scale_pool", "weights", "block_table")))
def test_non_contiguous_tensors_are_read_as_their_values(spec, seed, field):
    """Non-contiguous views are legitimate input (docs/reference/bug-classes.md, class 7): same verdict, same logits."""
    case = build_case(spec, seed)
    tensor = getattr(case, field)
    view = tensor.transpose(0, -1).contiguous().transpose(0, -1)  # same values, other strides
    assert not view.is_contiguous() or tensor.dim() < 2 or min(tensor.shape) <= 1 or view.stride() != tensor.stride()
    results = run([TorchBackend()], [case, dataclasses.replace(case, **{field: view})], RunConfig())
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS], f"{results=}"


# --------------------------------------------------------------------------- the API

@pytest.mark.parametrize("thing", [len, None, "torch"], ids=["function", "None", "name"])
def test_run_refuses_what_is_not_a_backend(thing):
    with pytest.raises(SpecError) as info:
        run([TorchBackend(), thing], [BASE], RunConfig())
    assert info.value.field == "backends[1]" and "Backend" in info.value.expected, f"{info.value}"


@pytest.mark.parametrize("thing", [bb.raises, TorchBackend], ids=["decorated-function", "class"])
def test_run_takes_what_makes_a_backend(thing):
    results = run([TorchBackend(), thing], [BASE], RunConfig())
    assert len(results) == 2 and results[1].verdict != Verdict.SKIP, f"{results=}"


def test_run_refuses_what_is_not_a_case():
    with pytest.raises(SpecError) as info:
        run([TorchBackend()], [{"q": BASE.q}], RunConfig())
    assert info.value.field == "cases" and "difftest.Case" in str(info.value)


OUTPUTS = [
    ("None", lambda shape: None, "contract: expected a dense torch.Tensor of shape"),
    ("a list", lambda shape: [[0.0] * shape[1]] * shape[0], ", got list"),
    ("meta", lambda shape: torch.empty(shape, device="meta"), "on meta"),
    ("sparse", lambda shape: torch.zeros(shape).to_sparse(), "torch.sparse_coo"),
    ("wrong shape", lambda shape: torch.zeros(shape[0], shape[1] + 1), "got a torch.strided tensor of shape"),
]


@pytest.mark.parametrize("label, make, reason", OUTPUTS, ids=[o[0] for o in OUTPUTS])
def test_backend_returning_something_odd_is_error_not_a_crash(label, make, reason):
    @backend(contract=bb.CONTRACT, name=f"returns-{label}")
    def odd(q, kv_cache, weights, context_lens, block_table, max_model_len):
        return make((weights.shape[0], max_model_len))

    (result,) = run([FunctionBackend.from_function(odd)], [BASE], RunConfig())
    assert result.verdict == Verdict.ERROR and reason in result.reason, f"{result=}"


# --------------------------------------------------------------------------- the command line

def _not(valid: set[str]) -> st.SearchStrategy[str]:
    """Option values outside `valid` that argparse hands over as values (no leading '-', printable)."""
    return st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12).filter(
        lambda s: s not in valid and not s.startswith("-"))


def _ints(text: st.SearchStrategy[int]) -> st.SearchStrategy[str]:
    return text.map(str)


BAD_OPTIONS = {  # option -> (bad values, the name the one-line error must contain)
    "--timeout": (st.one_of(_ints(st.integers(max_value=0)), st.sampled_from(["nan", "inf", "soon", "0.0"])),
                  "--timeout"),
    "--repeat": (st.one_of(_ints(st.integers(max_value=0)), st.sampled_from(["1.5", "twice"])), "--repeat"),
    "--count": (_ints(st.integers(max_value=-1)), "--count"),
    "--seed": (_ints(st.integers(min_value=2**62)), "--seed"),
    "--device": (_not({"cpu", "cuda"}), "--device"),
    "--encoding": (_not({"per-row", "per-sequence", "flattened", "flattened-indices", "prefix-sum"}), "--encoding"),
    "--layout": (_not({"block-split", "token-interleaved"}), "--layout"),
    "--cases": (_not({"random", "edges", "all"}), "--cases"),
    "--sanitize": (_not({"memcheck", "racecheck", "initcheck", "synccheck"}), "--sanitize"),
    "--batch": (_ints(st.integers(max_value=0)), "--batch"),
    "--heads": (_ints(st.integers(max_value=0)), "--heads"),
    "--head-dim": (_ints(st.integers(-64, 256).filter(lambda d: d < 16 or d % 16)), "--head-dim"),
    "--max-model-len": (_ints(st.integers(max_value=0)), "--max-model-len"),
    "--next-n": (st.sampled_from(["0", "1,0", "x", "1,,two"]), "next"),
    "--block-sizes": (st.sampled_from(["0", "16,0", "big"]), "block"),
    "--case-filter": (st.text("xyz", min_size=1, max_size=6).map(lambda s: f"zz-{s}*"), "--case-filter"),
    "--backends": (_not({"torch"}).filter(lambda s: "," not in s), "--backends"),
    "--backend-module": (st.sampled_from(["nocolon", "no.such.module:x", "tests.broken_backends:nothing",
                                          "tests.broken_backends:logits_with_limits", ":x", "os:"]),
                         "--backends"),  # --backend-module adds to the backends, and errors name --backends
    "--resume": (st.sampled_from(["/nonexistent/report.json", "/"]), "--resume"),
    "--spec": (st.sampled_from(["{", "[1]", '{"batch": 0}', '{"colour": 1}']), ""),
}


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), option=st.sampled_from(sorted(BAD_OPTIONS)))
def test_every_bad_option_is_one_line_exit_2(data, option):
    values, name = BAD_OPTIONS[option]
    value = data.draw(values, label="value")
    argv = ["run", "--no-progress", "--cases", "edges", "--case-filter", "length-one-*"]
    argv += [option, value] if option == "--backends" else ["--backends", "torch", option, value]
    code, out, err = run_cli(argv)
    assert code == ExitStatus.USAGE, f"{argv=} {code=}\n{out}\n{err}"
    assert err.startswith("difftest: error: ") and err.count("\n") == 1 and name in err, f"{argv=}: {err!r}"
    assert "Traceback" not in out + err


@settings(max_examples=30, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=12).map(lambda s: f"--zz{s}"),
       command=st.sampled_from(["run", "replay", "shrink", "backends"]))
def test_unknown_options_are_one_line_exit_2(name, command):
    code, _, err = run_cli([command, name])
    assert code == ExitStatus.USAGE and err.startswith("difftest: error: ") and err.count("\n") == 1, f"{err!r}"
    assert name in err or "required" in err, f"{err!r}"


def test_timeout_without_isolation_and_sanitize_all_alone_name_the_option():
    for extra, name in ((["--timeout", "5", "--no-isolate"], "--timeout="), (["--sanitize-all"], "--sanitize-all=")):
        code, _, err = run_cli(["run", "--backends", "torch", "--cases", "edges", "--no-progress", *extra])
        assert code == ExitStatus.USAGE and err.startswith(f"difftest: error: {name}") and err.count("\n") == 1, err
