"""Hostile bundles (issue 29's red-team pass): a bundle is data, so nothing it says may run code unless
the caller trusts it, and nothing in it may make replay or shrink take the machine down or print a
traceback. Each test names the attack it replays."""

from __future__ import annotations

import io
import json
import shutil
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from difftest.backends import Origin, as_loaded
from difftest.core.errors import SpecError
from difftest.core.indexer import PrefillIndexerCase
from difftest.core.kinds import ExitStatus, OperationKind
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, build_case
from difftest.operations import operation
from difftest.records.bundle import CASE_FILE, INFO_FILE, load_bundle, write_bundle
from tests import planted
from tests.support import CPU_OPERATION_BACKENDS, handmade_zip, run_cli
from tests.support import operation_bundle as write_operation_bundle

MODULE = "tests.planted:block_boundary_off_by_one"


@pytest.fixture(scope="module")
def failing(tmp_path_factory) -> Path:
    """A bundle of the planted block-boundary bug (FAIL(mask)), recorded with its module path."""
    case = build_case(CaseSpec(lengths=(16,), heads=4, head_dim=16), 0)
    loaded = as_loaded(planted.block_boundary_off_by_one)
    result = run_one(loaded, case, RunConfig())
    assert result.verdict.failed, result
    return write_bundle(tmp_path_factory.mktemp("bundles"), case, result, RunConfig(), loaded.origin)


def _forged(source: Path, where: Path, **info: object) -> Path:
    """A copy of `source` whose bundle.json says `info` instead."""
    folder = where / "forged"
    shutil.copytree(source, folder)
    data = json.loads((folder / INFO_FILE).read_text())
    (folder / INFO_FILE).write_text(json.dumps({**data, **info}))
    return folder


def _one_line(code: int, err: str, want: ExitStatus) -> str:
    lines = err.strip().splitlines()
    assert code == want and len(lines) == 1 and "Traceback" not in err, f"{code=} {err=}"
    return lines[0]


# A module beside the bundle and a conftest.py: what `pytest:main` or `beside:anything` would run.
PLANTED_CODE = "open({marker!r}, 'a').write('ran\\n')\n"
REGISTERED_LIES = ["pytest:main", "beside:anything", "os:abort", "sys:exit", "..evil:x", "difftest.cli:main",
                   "beside"]


@pytest.mark.parametrize("command", ["replay", "shrink"])
@pytest.mark.parametrize("isolate", [False, True])
def test_an_origin_that_claims_to_be_registered_imports_nothing(failing, tmp_path, monkeypatch, command, isolate):
    """`"origin": {"target": "pytest:main", "registered": true}` ran pytest (and the conftest.py beside
    the bundle), `beside:anything` imported the module beside it, `os:abort` killed replay and `sys:exit`
    made a failing bundle exit 0. A registered origin resolves among registered names only."""
    marker = tmp_path / "ran.txt"
    for name in ("conftest.py", "beside.py"):
        (tmp_path / name).write_text(PLANTED_CODE.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for target in REGISTERED_LIES:
        folder = _forged(failing, tmp_path / target.replace(":", "_").replace(".", "_"),
                         origin={"target": target, "registered": True, "why_not": ""}, isolate=isolate)
        code, _, err = run_cli([command, str(folder)])
        line = _one_line(code, err, ExitStatus.USAGE)
        if ":" in target:
            assert "origin.registered=True: expected false for the target" in line, line
        else:  # a name, but no registered one
            assert f"--backends='{target}': expected a registered name among" in line, line
        assert not marker.exists(), f"{target}: a registered-looking origin ran code"


@pytest.mark.parametrize("target, says", [
    ("..evil:x", "dotted Python names on both sides"),
    ("difftest.cli:main", "difftest.cli is difftest's own machinery"),
    ("sys:exit", "calling it raised SystemExit"),
])
def test_a_trusted_target_that_cannot_be_a_backend_is_one_line(failing, tmp_path, target, says):
    """With --trust-bundle: a relative import was a TypeError traceback, difftest.cli:main ran the
    command again (recursion), sys:exit ended the command with its own status."""
    folder = _forged(failing, tmp_path, origin={"target": target, "registered": False, "why_not": ""})
    for command in ("replay", "shrink"):
        code, _, err = run_cli([command, str(folder), "--trust-bundle"])
        assert says in _one_line(code, err, ExitStatus.USAGE), err


def test_a_cuda_bundle_on_a_host_without_one_is_one_line_for_shrink_too(failing, tmp_path, monkeypatch):
    """shrink of a bundle recorded on cuda, on a CPU host, was a traceback (replay said why)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    folder = _forged(failing, tmp_path, device="cuda")
    for command in ("replay", "shrink"):
        code, _, err = run_cli([command, str(folder), "--backends", MODULE])
        line = _one_line(code, err, ExitStatus.USAGE)
        assert f"{folder / INFO_FILE} device='cuda': expected a device torch can see" in line, line


def _declaring(source: Path, folder: Path, blocks: int) -> Path:
    """A copy of `source`'s case.npz whose kv_cache has `blocks` blocks: its own, then blocks of zeros
    (as many as a few megabytes deflate to gigabytes of)."""
    with np.load(source, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    kv = arrays.pop("kv_cache")
    shape = (blocks, *kv.shape[1:])
    header = np.lib.format.header_data_from_array_1_0(kv)
    header["shape"] = shape
    with zipfile.ZipFile(folder / CASE_FILE, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w") as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
        nbytes = int(np.prod(shape)) * kv.itemsize
        info = zipfile.ZipInfo("kv_cache.npy")
        info.compress_type = zipfile.ZIP_DEFLATED
        with archive.open(info, "w", force_zip64=True) as member:
            np.lib.format.write_array_header_1_0(member, header)
            member.write(kv.tobytes() + bytes(nbytes - kv.nbytes))
    return folder


def test_a_case_archive_declaring_more_than_the_host_can_hold_is_refused_before_inflating(failing, tmp_path,
                                                                                          monkeypatch):
    """A 4 MB case.npz declaring a 4 GiB array inflated for 19 s, then the process died: what an archive
    declares is weighed against the host's free memory from the headers alone."""
    folder = tmp_path / "big"
    shutil.copytree(failing, folder)
    case = load_bundle(failing).case
    _declaring(failing / CASE_FILE, folder, case.k_pool.shape[0] + 1024)  # a few hundred KiB of zeros
    declared = sum(np.prod(a.shape) * a.itemsize for a in _arrays(folder / CASE_FILE))
    # This host, for the test, has less memory free than three times what the archive declares.
    monkeypatch.setattr("difftest.core.case_archive.available_memory", lambda device: int(declared * 2))
    with pytest.raises(SpecError) as refused:
        load_bundle(folder)
    assert refused.value.field.endswith(f"{CASE_FILE} size") and "arrays this host can load" in refused.value.expected
    monkeypatch.setattr("difftest.core.case_archive.available_memory", lambda device: int(declared * 4))
    assert load_bundle(folder).case.k_pool.shape[0] == case.k_pool.shape[0] + 1024


def _arrays(path: Path) -> list[np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return [z[k] for k in z.files]


def test_a_truly_registered_origin_still_replays_without_trust(failing, tmp_path):
    """The forged bundles above are refused for what their origin says, not for being copies: the
    same bundle naming the registered `torch` replays (and passes: the reference has no planted bug)."""
    folder = _forged(failing, tmp_path, origin={"target": "torch", "registered": True, "why_not": ""},
                     backend="torch")
    code, out, err = run_cli(["replay", str(folder)])
    assert code == ExitStatus.OK and "verdict: PASS" in out, f"{out=} {err=}"
    assert load_bundle(folder).origin == Origin("torch", registered=True)


# --------------------------------------------------------------------------- every operation's bundles

@pytest.fixture(scope="module", params=list(CPU_OPERATION_BACKENDS))
def operation_bundle(request, tmp_path_factory) -> Path:
    """A bundle of each operation other than paged logits (tests.support.operation_bundle)."""
    return write_operation_bundle(request.param, tmp_path_factory.mktemp(request.param))


def _members(folder: Path) -> dict[str, bytes]:
    """The .npy files of a bundle's case.npz, by member name, in their order."""
    with zipfile.ZipFile(folder / CASE_FILE) as archive:
        return {info.filename: archive.read(info) for info in archive.infolist()}


def _npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=True)
    return buffer.getvalue()


def _with_meta(members: dict[str, bytes], field: str, value: str) -> dict[str, bytes]:
    """The members with the meta's `field` set to the JSON text `value` (NaN and 3.7 included)."""
    data = _meta_of(members)
    data[field] = "@"
    return {**members, "meta.npy": _npy_bytes(np.array(json.dumps(data).replace('"@"', value)))}


def _first_array(members: dict[str, bytes]) -> str:
    return next(name for name in members if name != "meta.npy")


def _size_fields(members: dict[str, bytes]) -> list[str]:
    """The meta's integer fields of the case's structure (rows, widths, k; a paged case's B, H, ...)."""
    return [key for key, value in _meta_of(members).items() if type(value) is int and key != "seed"]


def _meta_of(members: dict[str, bytes]) -> dict:
    return json.loads(str(np.load(io.BytesIO(members["meta.npy"]), allow_pickle=False)))


# name -> the corrupt archive made of a valid one's members
CORRUPTIONS: dict[str, Callable[[dict[str, bytes]], bytes]] = {
    "truncated": lambda m: handmade_zip(list(m.items()))[:-40],
    "not-a-zip": lambda m: b"not a zip",
    "no-meta": lambda m: handmade_zip([(n, d) for n, d in m.items() if n != "meta.npy"]),
    "no-array": lambda m: handmade_zip([(n, d) for n, d in m.items() if n != _first_array(m)]),
    "extra-member": lambda m: handmade_zip([*m.items(), ("x.npy", _npy_bytes(np.zeros(3)))]),
    "duplicate-member": lambda m: handmade_zip([*m.items(), (_first_array(m), m[_first_array(m)])]),
    "wrong-dtype": lambda m: handmade_zip([*{**m, _first_array(m): _npy_bytes(np.zeros(3, ">f4"))}.items()]),
    "wrong-shape": lambda m: handmade_zip([*{**m, _first_array(m): _npy_bytes(np.zeros((2, 2, 2, 2, 2), "u1"))}
                                          .items()]),
    "pickle": lambda m: handmade_zip([*{**m, _first_array(m): _npy_bytes(np.array([{"x": 1}], dtype=object))}
                                     .items()]),
    "meta-not-json": lambda m: handmade_zip([*{**m, "meta.npy": _npy_bytes(np.array("{not json"))}.items()]),
    "meta-not-text": lambda m: handmade_zip([*{**m, "meta.npy": _npy_bytes(np.zeros(4))}.items()]),
    "declared-larger": lambda m: handmade_zip(list(m.items()), declared={_first_array(m): 2**32 - 1}),
    "declared-smaller": lambda m: handmade_zip(list(m.items()), declared={_first_array(m): 8}),
    "encrypted": lambda m: handmade_zip(list(m.items()), flags=1),
    "bzip2": lambda m: handmade_zip(list(m.items()), method=zipfile.ZIP_BZIP2),
}


def _refused_in_one_line(folder: Path) -> None:
    """load_bundle refuses the bundle with one SpecError line, and `replay` says it in one line, exit 2."""
    with pytest.raises(SpecError) as refused:
        load_bundle(folder)
    assert "\n" not in str(refused.value), refused.value
    code, _, err = run_cli(["replay", str(folder)])
    _one_line(code, err, ExitStatus.USAGE)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_corrupt_operation_bundle_is_refused_in_one_line(operation_bundle, tmp_path, corruption):
    """An operation's case.npz was read outside the paged archive's checks: a member of another dtype, shape or
    size, a pickle, a meta of NaN or negative sizes, k = 3.7 or true were tracebacks or taken."""
    folder = tmp_path / "corrupt"
    shutil.copytree(operation_bundle, folder)
    (folder / CASE_FILE).write_bytes(CORRUPTIONS[corruption](_members(operation_bundle)))
    _refused_in_one_line(folder)


@pytest.mark.parametrize("value", ["-1", "3.7", "true", "NaN", '"3"', "null"])
def test_a_meta_size_that_is_no_count_is_refused_in_one_line(operation_bundle, tmp_path, value):
    """Each integer of an operation archive's meta (its rows, widths, k; an indexer case's B, H, topk_k...) as a
    negative, fractional, boolean, NaN, text or missing number."""
    members = _members(operation_bundle)
    fields = _size_fields(members)
    assert len(fields) >= 4, fields
    for field in fields:
        folder = tmp_path / field
        shutil.copytree(operation_bundle, folder)
        (folder / CASE_FILE).write_bytes(handmade_zip(list(_with_meta(members, field, value).items())))
        _refused_in_one_line(folder)


def test_an_operation_archive_declaring_more_than_the_host_can_hold_is_refused_before_inflating(operation_bundle,
                                                                                              tmp_path, monkeypatch):
    """A 4 MB top-k bundle took 9.4 GiB and 10 minutes: an operation's archive is weighed against the host's free
    memory from its headers alone, as a paged one is."""
    folder = tmp_path / "big"
    shutil.copytree(operation_bundle, folder)
    declared = sum(a.nbytes for a in _arrays(folder / CASE_FILE))
    monkeypatch.setattr("difftest.core.case_archive.available_memory", lambda device: int(declared * 2))
    with pytest.raises(SpecError) as refused:
        load_bundle(folder)
    assert refused.value.field.endswith(f"{CASE_FILE} size") and "arrays this host can load" in refused.value.expected
    monkeypatch.setattr("difftest.core.case_archive.available_memory", lambda device: int(declared * 4))
    assert load_bundle(folder).case.rows >= 1


@pytest.mark.parametrize("k, says", [
    (np.float64(3.7), "topk_k.dtype='<f8': expected <i8"), (np.bool_(True), "topk_k.dtype='|b1': expected <i8"),
    (np.str_("3"), "topk_k.dtype='<U1': expected <i8"), (np.array([3, 4]), "topk_k.shape=(2,): expected ()"),
    (np.int64(0), "member topk_k=0: expected the k of the top-k stage, an integer in [1, "),
    (np.int64(2**62), f"member topk_k={2**62}: expected the k of the top-k stage, an integer in [1, "),
    (None, "member topk_k=None: expected the k of the top-k stage"),
])
def test_a_prefill_indexer_k_is_read_through_the_archive_checks(tmp_path, k, says):
    """The prefill indexer's `topk_k` member was read with np.load outside the checks: 4 tracebacks, and k = 3.7
    and True taken (as 3 and 1)."""
    op = operation(OperationKind.PREFILL_INDEXER)
    case = op.build(op.suite()[0], 0, "cpu")
    path = case.save(tmp_path / "valid.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {name: z[name] for name in z.files if name != "topk_k"}
    np.savez(tmp_path / "case.npz", **arrays, **({} if k is None else {"topk_k": np.asarray(k)}))
    with pytest.raises(SpecError) as refused:
        PrefillIndexerCase.load(tmp_path / "case.npz")
    assert says in str(refused.value), refused.value


# What a symbolic link in a bundle points at: a file the bundle's author cannot read, but its reader can.
SECRET = "token=hunter2-what-the-link-points-at"


def _linked(source: Path, where: Path, name: str, target: Path) -> Path:
    """A copy of `source` whose file `name` is a symbolic link to `target`."""
    folder = where / "linked"
    shutil.copytree(source, folder)
    (folder / name).unlink()
    (folder / name).symlink_to(target)
    return folder


@pytest.mark.parametrize("name", [INFO_FILE, CASE_FILE])
@pytest.mark.parametrize("target", ["a-secret", "a-bundles-own-file"])
def test_a_bundle_file_that_is_a_symbolic_link_is_refused_without_quoting_what_it_points_at(failing, tmp_path, name,
                                                                                            target):
    """bundle.json linked to /etc/shadow was refused with the shadow file's first 80 characters in the error.
    A link is refused whatever it points at, even a bundle's real file: a bundle holds files of its own."""
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET + "\n")
    pointed = secret if target == "a-secret" else failing / name
    folder = _linked(failing, tmp_path, name, pointed)
    for command in ("replay", "shrink"):
        code, out, err = run_cli([command, str(folder), "--backends", MODULE])
        line = _one_line(code, err, ExitStatus.USAGE)
        assert f"{folder / name}" in line and "a file of its own, not a symbolic link" in line, line
        assert "hunter2" not in out + err
    with pytest.raises(SpecError):
        load_bundle(folder)


def test_a_bundle_json_that_is_no_json_is_refused_without_quoting_it(failing, tmp_path):
    folder = tmp_path / "not-json"
    shutil.copytree(failing, folder)
    (folder / INFO_FILE).write_text(SECRET + "\n")
    code, _, err = run_cli(["replay", str(folder)])
    line = _one_line(code, err, ExitStatus.USAGE)
    assert "a JSON object of bundle fields" in line and "hunter2" not in err, line
