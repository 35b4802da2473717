"""Hostile bundles (issue 29's red-team pass): a bundle is data, so nothing it says may run code unless
the caller trusts it, and nothing in it may make replay or shrink take the machine down or print a
traceback. Each test names the attack it replays."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest

from difftest.backends import Origin, as_loaded
from difftest.core.errors import SpecError
from difftest.core.kinds import ExitStatus
from difftest.engine.config import RunConfig
from difftest.engine.runner import run_one
from difftest.generators import CaseSpec, build_case
from difftest.records.bundle import CASE_FILE, INFO_FILE, load_bundle, write_bundle
from tests import planted
from tests.support import run_cli

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
