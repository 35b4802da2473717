"""difftest.core.triton_interpret: interpreted kernels, and the folded reduction that stands in for the
interpreter's per-element one without changing a single bit."""

from pathlib import Path

import pytest
import torch
from triton.runtime import interpreter

from difftest.core.triton_interpret import Landing, interpreter_compat, load_kernel_module

KERNELS = load_kernel_module(Path(__file__).with_name("reduce_kernels.py"), "reduce_kernels", interpret=True)
M, N = 8, 16


def _reduce(x: torch.Tensor, axis: int, combine: int, keep: bool, stock: bool) -> torch.Tensor:
    out = torch.zeros({0: N, 1: M}.get(axis, 1), dtype=torch.float32)
    original = interpreter.ReduceOps.generic_reduce
    with interpreter_compat():
        folded = interpreter.ReduceOps.generic_reduce
        interpreter.ReduceOps.generic_reduce = original if stock else folded
        try:
            KERNELS.reduce_kernel[(1,)](x, out, M, N, axis, combine, keep)
        finally:
            interpreter.ReduceOps.generic_reduce = folded
    return out


# Triton's interpreter cannot reduce a (value, index) pair over a whole tensor itself (it flattens
# only the first input), so that one combination has nothing to be equal to.
CASES = [pytest.param(combine, axis, keep, id=f"{name}-axis{axis}-keep{int(keep)}")
         for combine, name in enumerate(["sum", "lopsided", "value-index-pair"])
         for axis in (0, 1, -1) for keep in (False, True) if (combine, axis) != (2, -1)]


@pytest.mark.parametrize(("combine", "axis", "keep"), CASES)
def test_the_folded_reduction_is_bit_equal_to_the_interpreters_own(combine: int, axis: int, keep: bool) -> None:
    # Heavy-tailed values, so that any change in the order of the float32 additions shows.
    x = torch.randn(M, N, generator=torch.Generator().manual_seed(combine * 7 + axis)) ** 5 * 1e3
    folded, stock = _reduce(x, axis, combine, keep, stock=False), _reduce(x, axis, combine, keep, stock=True)
    assert torch.equal(folded.view(torch.int32), stock.view(torch.int32)), f"{folded=}, {stock=}"


def test_the_interpreters_own_reduction_is_back_after_the_block() -> None:
    before = interpreter.ReduceOps.generic_reduce
    with interpreter_compat():
        assert interpreter.ReduceOps.generic_reduce is not before
    assert interpreter.ReduceOps.generic_reduce is before


# A file whose top level cannot run here (an import of a package that does not exist), holding a kernel
# and a wrapper that reads a name the file imports: what load_kernel_defs is for.
PARTIAL_FILE = '''
import no_such_package_anywhere
from no_such_package_anywhere import SCALE

raise RuntimeError("the top level ran")


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n) * 2.0, mask=offsets < n)


def scale(x):
    out = torch.empty_like(x)
    scale_kernel[(1,)](x, out, x.numel(), BLOCK=16)
    return out * SCALE
'''


def test_load_kernel_defs_runs_only_the_named_functions_with_the_names_given(tmp_path: Path) -> None:
    import triton
    import triton.language as tl

    from difftest.core.triton_interpret import global_names, load_kernel_defs

    path = tmp_path / "partial.py"
    path.write_text(PARTIAL_FILE)
    namespace = {"triton": triton, "tl": tl, "torch": torch, "SCALE": 3.0}
    module = load_kernel_defs(path, ("scale_kernel", "scale"), "partial", interpret=True, namespace=namespace)
    assert global_names(module.scale) == {"torch", "scale_kernel", "SCALE"}
    assert global_names(module.scale_kernel) == {"tl"}
    with interpreter_compat():
        got = module.scale(torch.arange(5, dtype=torch.float32))
    assert got.tolist() == [0.0, 6.0, 12.0, 18.0, 24.0]
    with pytest.raises(LookupError, match="defines no missing"):
        load_kernel_defs(path, ("scale", "missing"), "partial", interpret=True, namespace=namespace)


# Each program fills its own span with its number + 1; program 0 also writes 100 into program 1's first slot.
# Then each reads its first slot back.
CROSS_FILE = '''
@triton.jit
def cross_kernel(buf_ptr, out_ptr, SPAN: tl.constexpr):
    program = tl.program_id(0)
    tl.store(buf_ptr + program * SPAN + tl.arange(0, SPAN), tl.full([SPAN], 1, tl.int32) + program)
    if program == 0:
        tl.store(buf_ptr + SPAN, 100)
    tl.store(out_ptr + program, tl.load(buf_ptr + program * SPAN))


@triton.jit
def reread_kernel(buf_ptr, out_ptr, SPAN: tl.constexpr):
    program = tl.program_id(0)
    tl.store(buf_ptr + program * SPAN + tl.arange(0, SPAN), tl.full([SPAN], 1, tl.int32) + program)
    if program == 0:
        tl.store(buf_ptr + SPAN, 100)
    first = tl.load(buf_ptr + program * SPAN)
    tl.store(out_ptr + 2 * program, first)
    tl.store(out_ptr + 2 * program + 1, tl.load(buf_ptr + program * SPAN))
'''


def test_late_cross_program_stores_land_after_the_owners_own(tmp_path: Path) -> None:
    import triton
    import triton.language as tl

    from difftest.core.triton_interpret import late_cross_program_stores, load_kernel_defs

    path = tmp_path / "cross.py"
    path.write_text(CROSS_FILE)
    kernel = load_kernel_defs(path, ("cross_kernel",), "cross", interpret=True, namespace={"triton": triton, "tl": tl})
    buf, out = torch.zeros(8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    with interpreter_compat():
        kernel.cross_kernel[(2,)](buf, out, 4)
        assert out.tolist() == [1, 2], out  # one after another: program 1 overwrites program 0's store
        with late_cross_program_stores(buf.data_ptr(), 4 * buf.element_size(), 2):
            kernel.cross_kernel[(2,)](buf, out, 4)
        assert out.tolist() == [1, 100], out  # program 0's store landed after program 1's own
        kernel.cross_kernel[(2,)](buf, out, 4)
    assert out.tolist() == [1, 2], out  # the interpreter's own order is back after the block


@pytest.mark.parametrize(("landing", "reads"), [(Landing.FIRST_READ, [1, 1, 100, 100]),
                                               (Landing.REREAD, [1, 1, 2, 100]), (Landing.END, [1, 1, 2, 2])])
def test_late_cross_program_stores_land_where_asked(tmp_path: Path, landing: Landing, reads: list[int]) -> None:
    """Program 0's store into program 1's first slot lands before program 1's first read of it, between its two
    reads, or after the launch; stores past every program's bytes are left alone."""
    import triton
    import triton.language as tl

    from difftest.core.triton_interpret import late_cross_program_stores, load_kernel_defs

    path = tmp_path / "cross.py"
    path.write_text(CROSS_FILE)
    kernel = load_kernel_defs(path, ("reread_kernel",), "reread", interpret=True,
                              namespace={"triton": triton, "tl": tl})
    buf, out = torch.zeros(8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    with interpreter_compat(), late_cross_program_stores(buf.data_ptr(), 4 * buf.element_size(), 2,
                                                         landing):
        kernel.reread_kernel[(2,)](buf, out, 4)
    assert out.tolist() == reads and buf[4] == 100, (out, buf)
    buf.zero_()
    with interpreter_compat(), late_cross_program_stores(buf.data_ptr(), 4 * buf.element_size(), 1,
                                                         landing):
        kernel.reread_kernel[(2,)](buf, out, 4)  # program 1's bytes are nobody's: its own store is the last
    assert out.tolist() == [1, 1, 2, 2] and buf[4] == 2, (out, buf)
