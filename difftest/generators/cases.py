"""Which cases: the curated edge list and the default random suite (docs/reference/bug-classes.md)."""

from __future__ import annotations

from difftest.core.errors import SpecError
from difftest.core.kinds import Fp8Flavour
from difftest.core.spec import CaseSpec, LengthDist, Stale, Values

_BASE = CaseSpec(heads=32, head_dim=64, block_size=16, max_model_len=128)


def edge_cases() -> list[CaseSpec]:
    """Named specs that sit on the edges where these kernels have broken before."""
    bs = _BASE.block_size
    return [
        _BASE.replace(name="all-padding", lengths=(0, 0, 0), next_n=2),
        _BASE.replace(name="length-one", lengths=(1, 1), next_n=1),
        _BASE.replace(name="shorter-than-next-n", lengths=(0, 1, 2, 3, 4), next_n=4),
        _BASE.replace(name="block-boundaries", next_n=2,
                      lengths=(bs - 1, bs, bs + 1, 2 * bs - 1, 2 * bs, 2 * bs + 1)),
        _BASE.replace(name="max-model-len", length_dist=LengthDist.FULL, batch=2, next_n=3),
        _BASE.replace(name="padding-requests", batch=3, next_n=2, padding=3, stale=Stale.OTHER),
        _BASE.replace(name="shared-prefix-blocks", lengths=(70, 70, 45, 100), next_n=2, shared_blocks=True),
        _BASE.replace(name="stale-canary-table", batch=4, next_n=3, extra_columns=1, stale=Stale.CANARY),
        _BASE.replace(name="mtp-overhang-column", lengths=(128, 127), next_n=4, extra_columns=1),
        _BASE.replace(name="heavy-tailed-values", batch=4, next_n=2, values=Values.HEAVY),
        _BASE.replace(name="integer-exact", batch=4, next_n=2, values=Values.INTEGER),
        _BASE.replace(name="e4m3fnuz-flavour", batch=3, next_n=1, fp8=Fp8Flavour.E4M3FNUZ),
        _BASE.replace(name="block-size-64", block_size=64, max_model_len=256, next_n=2,
                      length_dist=LengthDist.EDGES, batch=6),
        _BASE.replace(name="deepseek-heads", heads=64, head_dim=128, block_size=64, max_model_len=256,
                      next_n=2, batch=2),
    ]


def default_specs() -> list[CaseSpec]:
    """The random suite `difftest run` draws from when no spec is given: one spec per next_n."""
    return [
        _BASE.replace(name=f"random-mtp{n}-{dist.value}", next_n=n, length_dist=dist, batch=4)
        for n, dist in ((1, LengthDist.UNIFORM), (2, LengthDist.EDGES), (3, LengthDist.UNIFORM),
                        (4, LengthDist.EDGES))
    ]



SUITES = ("random", "edges", "all")


def suite(kind: str = "all", count: int = 6, seed: int = 0, next_n: tuple[int, ...] | None = None,
          block_sizes: tuple[int, ...] | None = None, **overrides: object) -> list[tuple[CaseSpec, int]]:
    """(spec, seed) pairs of a named suite: `count` seeds of each default spec, and/or the edges.

    next_n and block_sizes multiply the specs (one copy per value); heads and head_dim replace
    those of every spec; other overrides (batch, max_model_len, ...) replace fields of the random
    specs only, since the edge specs' lengths and tables are what makes them edges. Seeds differ
    per spec so no two specs share lengths.
    """
    if kind not in SUITES:
        raise SpecError("cases", kind, f"one of {list(SUITES)}")
    shape = {k: overrides.pop(k) for k in ("heads", "head_dim") if k in overrides}
    randoms = [s.replace(**overrides, **shape) for s in default_specs()] if kind != "edges" else []
    randoms = _vary(_vary(randoms, "next_n", next_n), "block_size", block_sizes)
    edges = [s.replace(**shape) for s in edge_cases()] if kind != "random" else []
    edges = _vary(_vary(edges, "next_n", next_n), "block_size", block_sizes)
    pairs = [(spec.validate(), seed + 1000 * index + i)
             for index, spec in enumerate(randoms) for i in range(count)]
    return pairs + [(spec.validate(), seed + 1000 * (len(randoms) + index)) for index, spec in enumerate(edges)]


def _vary(specs: list[CaseSpec], field: str, values: tuple[int, ...] | None) -> list[CaseSpec]:
    """One copy of each spec per value of `field`, named after it; duplicates dropped."""
    if not values:
        return specs
    short = {"next_n": "mtp", "block_size": "bs"}[field]
    varied = [s.replace(**{field: v}, name=f"{s.name.split(f'-{short}')[0]}-{short}{v}{_rest(s.name, short)}")
              for s in specs for v in values]
    return list(dict.fromkeys(varied))


def _rest(name: str, short: str) -> str:
    """What follows '-<short><number>' in a spec name, so renaming keeps the other parts."""
    _head, sep, tail = name.partition(f"-{short}")
    return "-" + tail.split("-", 1)[1] if sep and "-" in tail else ""
