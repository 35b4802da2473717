"""Hypothesis strategies: draw a case's structure (a CaseSpec), then build its tensors with build_case.

Only the structure is drawn by hypothesis; the tensors come from torch's seeded RNG, so a shrunk
example is the small spec and the seed that `build_case(spec, seed)` replays anywhere. Draws are
ordered so that shrinking moves toward fewer sequences, shorter lengths, smaller next_n, the first
listed block size / H / D, no padding, plain tables (no sharing, canary stale entries, no extra
column), integer values, e4m3fn, and seed 0.

    from difftest.generators.strategies import cases

    @given(cases(max_batch=3, block_sizes=(16,)))
    def test_my_kernel(case): ...
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from difftest.core.case import Case
from difftest.core.kinds import Fp8Flavour
from difftest.core.spec import CaseSpec, Stale, Values
from difftest.generators.tensors import build_case

# Simplest first: sampled_from shrinks toward the first element.
VALUES_ORDER = (Values.INTEGER, Values.NORMAL, Values.HEAVY)
STALE_ORDER = (Stale.CANARY, Stale.ZERO, Stale.OTHER)
FP8_ORDER = (Fp8Flavour.E4M3FN, Fp8Flavour.E4M3FNUZ)
MAX_SEED = 2**32 - 1


def specs(*, max_batch: int = 4, max_next_n: int = 4, heads: Sequence[int] = (1, 4, 32, 64),
          head_dims: Sequence[int] = (16, 64, 128), block_sizes: Sequence[int] = (16, 1, 64),
          max_model_len: int = 128, max_padding: int = 2, max_extra_columns: int = 1,
          values: Sequence[Values] = VALUES_ORDER, fp8: Sequence[Fp8Flavour] = FP8_ORDER,
          name: str = "hypothesis") -> st.SearchStrategy[CaseSpec]:
    """A strategy for CaseSpecs with every length given explicitly (`lengths`, so B = len(lengths)).

    Draws next_n in [1, max_next_n], a block size, H and D from the given choices, 1..max_batch
    lengths in [0, max_model_len] (some of them from the edges of docs/reference/bug-classes.md:
    0, 1, around next_n and around block multiples), 0..max_padding trailing padding requests,
    shared prefix blocks or not, the stale-entry kind, 0..max_extra_columns extra table columns,
    the values family and the fp8 flavour.

    Shrinks toward fewer sequences, shorter lengths, next_n 1, the first listed block size, H and D,
    no padding, no sharing, canary stale entries, no extra column, the first listed values family
    (integer by default) and the first listed fp8 flavour.
    """
    _check_bound("max_batch", max_batch, 1)
    _check_bound("max_next_n", max_next_n, 1)
    _check_bound("max_model_len", max_model_len, 1)
    _check_bound("max_padding", max_padding, 0)
    _check_bound("max_extra_columns", max_extra_columns, 0)
    _check_choices("heads", heads, lambda h: isinstance(h, int) and h >= 1, "a positive int")
    _check_choices("head_dims", head_dims, lambda d: isinstance(d, int) and d >= 16 and d % 16 == 0,
                   "a positive multiple of 16")
    _check_choices("block_sizes", block_sizes, lambda b: isinstance(b, int) and b >= 1, "a positive int")
    _check_choices("values", values, lambda v: isinstance(v, Values), "a difftest.generators.Values")
    _check_choices("fp8", fp8, lambda f: isinstance(f, Fp8Flavour), "a difftest.Fp8Flavour")
    bounds = dict(max_batch=max_batch, max_next_n=max_next_n, heads=tuple(heads), head_dims=tuple(head_dims),
                  block_sizes=tuple(block_sizes), max_model_len=max_model_len, max_padding=max_padding,
                  max_extra_columns=max_extra_columns, values=tuple(values), fp8=tuple(fp8), name=name)
    return _specs(**bounds)


@st.composite
def _specs(draw: st.DrawFn, *, max_batch: int, max_next_n: int, heads: tuple[int, ...],
           head_dims: tuple[int, ...], block_sizes: tuple[int, ...], max_model_len: int, max_padding: int,
           max_extra_columns: int, values: tuple[Values, ...], fp8: tuple[Fp8Flavour, ...],
           name: str) -> CaseSpec:
    # next_n and the block size come first: the edge lengths are drawn around them.
    next_n = draw(st.integers(1, max_next_n))
    block_size = draw(st.sampled_from(block_sizes))
    lengths = draw(st.lists(_lengths(next_n, block_size, max_model_len), min_size=1, max_size=max_batch))
    return CaseSpec(
        name=name, batch=len(lengths), next_n=next_n, block_size=block_size, lengths=tuple(lengths),
        heads=draw(st.sampled_from(heads)), head_dim=draw(st.sampled_from(head_dims)),
        max_model_len=max_model_len, padding=draw(st.integers(0, max_padding)),
        shared_blocks=draw(st.booleans()), stale=draw(st.sampled_from(STALE_ORDER)),
        extra_columns=draw(st.integers(0, max_extra_columns)), values=draw(st.sampled_from(values)),
        fp8=draw(st.sampled_from(fp8))).validate()


def _lengths(next_n: int, block_size: int, max_model_len: int) -> st.SearchStrategy[int]:
    """Any length, or one of the edges where these kernels broke before; both shrink toward 0."""
    edges = {0, 1, next_n - 1, next_n, next_n + 1, max_model_len - 1, max_model_len}
    edges |= {k * block_size + d for k in (1, 2) for d in (-1, 0, 1)}
    return st.integers(0, max_model_len) | st.sampled_from(sorted(e for e in edges if 0 <= e <= max_model_len))


def cases(*, device: str = "cpu", **spec_bounds: object) -> st.SearchStrategy[Case]:
    """A strategy for Cases: a spec drawn by `specs(**spec_bounds)`, then a seed, built by build_case.

    The case's meta holds the spec (as JSON) and the seed, so a failing example replays with
    `build_case(CaseSpec.from_json(case.meta["spec"]), case.meta["seed"])`. Shrinks as `specs`
    does, then toward seed 0.
    """
    if not isinstance(device, str):
        raise InvalidArgument(f"device={device!r} (type={type(device).__name__}) must be a str")
    structure = specs(**spec_bounds)  # type: ignore[arg-type]
    return st.tuples(structure, st.integers(0, MAX_SEED)).map(lambda pair: build_case(*pair, device=device))


def _check_bound(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise InvalidArgument(f"{name}={value!r} (type={type(value).__name__}) must be an int >= {least}")


def _check_choices(name: str, choices: object, valid: Callable[[object], bool], what: str) -> None:
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Sequence) or not choices:
        raise InvalidArgument(f"{name}={choices!r} (type={type(choices).__name__}) must be a non-empty "
                              f"sequence of choices, simplest first")
    bad = [c for c in choices if isinstance(c, bool) or not valid(c)]
    if bad:
        raise InvalidArgument(f"{name}={choices!r}: {bad[0]!r} (type={type(bad[0]).__name__}) is not {what}")
