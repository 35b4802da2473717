"""Command lines that run a case again: the one formatter behind every line difftest prints to paste.

`difftest run`'s failure blocks, `difftest fuzz`'s repro lines, `difftest shrink`, `difftest replay`,
`difftest.check`'s message and a bundle's recorded command all come from here, so a line carries every
option that shaped the case wherever it is printed: the backend (a registered name, or the
'package.module:object' path that loads it), the spec and seed the case is drawn from, the device, the
oracle, the what-if encoding and layout, the launches per case (repeat), the metamorphic relations checked,
where the backend ran (isolation, its timeouts) and the sanitizer replay. Options are written out even where
they equal today's defaults (device, oracle, isolation), so a line means the same after a default changes.
Pasted, a line parses with `difftest`'s own parser back to the same options (a test checks it).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from difftest.backends import Origin
from difftest.core.case import Case
from difftest.core.kinds import CaseKind, OperationKind
from difftest.core.spec import CaseSpec
from difftest.engine.config import RunConfig

_CONFIG_DEFAULTS = RunConfig()  # what `difftest run` feeds a backend when an option is not given


def run_command(target: str, spec: CaseSpec, seed: int, config: RunConfig) -> str:
    """`difftest run --backends TARGET --spec JSON --seed N` and every option of `config` that shapes the
    case's verdict: the case drawn from (spec, seed) through backend `target` (a registered name or
    'package.module:object'), fed as `config` fed it. The spec lists its name and the fields that differ
    from CaseSpec's defaults (--spec fills in the rest)."""
    return shlex.join(["difftest", "run", "--backends", target, "--spec", _spec_json(spec), "--seed", str(seed),
                       *config_words(config)])


def operation_command(op: OperationKind, target: str, cases: CaseKind, seed: int, case: str,
                      config: RunConfig) -> str:
    """`difftest run --op OP --backends TARGET --cases KIND --seed N --case-filter CASE` and every option of
    `config` that shapes the verdict: the one case named `case` of the operation's plan (the backend's envelope,
    or the operation's fixed suite) drawn at `seed` again, through backend `target`."""
    return shlex.join(["difftest", "run", "--op", op.value, "--backends", target, "--cases", cases.value, "--seed",
                       str(seed), "--case-filter", _literal_glob(case), *config_words(config)])


def config_words(config: RunConfig) -> list[str]:
    """The `difftest run` options that make the run's RunConfig `config` again, as far as it shapes a
    verdict (timing does not): device, oracle and isolation always, the rest where they differ from
    RunConfig's defaults."""
    words = ["--device", config.device, "--oracle", config.oracle_kind.value,
             "--isolate" if config.isolated else "--no-isolate"]
    for option, value in (("--encoding", config.encoding), ("--layout", config.layout),
                          ("--sanitize", config.sanitize)):
        if value is not None:
            words += [option, value.value]
    if config.timeout is not None:
        words += ["--timeout", _number(config.timeout)]
    if config.startup_timeout != _CONFIG_DEFAULTS.startup_timeout:
        words += ["--startup-timeout", _number(config.startup_timeout)]
    if config.repeat != _CONFIG_DEFAULTS.repeat:
        words += ["--repeat", str(config.repeat)]
    if config.metamorphic:
        words += ["--metamorphic", ",".join(relation.value for relation in config.metamorphic)]
    if config.graph:
        words.append("--graph")
    return words


def case_command(target: str, case: Case, config: RunConfig) -> str | None:
    """run_command for a case drawn from a spec and seed (its meta says which); None for a case that was
    not (a golden file, a batch's merged case): only its bundle runs it again."""
    spec, seed = case.meta.get("spec"), case.meta.get("seed")
    if spec is None or seed is None:
        return None
    return run_command(target, CaseSpec.from_json(spec), int(seed), config)


def replay_command(folder: str | Path, origin: Origin) -> str:
    """`difftest replay FOLDER`: the bundle records its device and every option of its run, so the line
    needs none; a backend loaded from a module path is imported again only when trusted, and the
    writer of the bundle is the one who trusts it."""
    trust = [] if origin.registered or origin.target is None else ["--trust-bundle"]
    return shlex.join(["difftest", "replay", str(folder), *trust])


def backend_target(origin: Origin, name: str) -> str:
    """What names a backend on a command line: the target that loads it again, else its name."""
    return origin.target or name


def _literal_glob(name: str) -> str:
    """The fnmatch pattern that matches `name` alone: its *, ? and [ each in brackets."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def _spec_json(spec: CaseSpec) -> str:
    defaults = CaseSpec().to_json()
    fields = {k: v for k, v in spec.to_json().items() if k == "name" or defaults.get(k) != v}
    return json.dumps(fields, separators=(",", ":"))


def _number(seconds: float) -> str:
    """Seconds as the shortest text that parses back to the same float ('30', '2.5')."""
    return repr(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))
