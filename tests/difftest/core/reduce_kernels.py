"""Triton kernels that reduce with their own combine functions, for tests/difftest/test_triton_interpret.py."""

import triton
import triton.language as tl


@triton.jit
def _add(a, b):
    return a + b


@triton.jit
def _lopsided(a, b):  # neither commutative nor associative: any change of fold order shows
    return a * 0.5 + b


@triton.jit
def _keep_larger(a, ia, b, ib):  # a (value, index) pair: two inputs, two outputs
    keep = a >= b
    return tl.where(keep, a, b), tl.where(keep, ia, ib)


@triton.jit
def _reduced(x, AXIS: tl.constexpr, COMBINE: tl.constexpr, KEEP: tl.constexpr):
    if COMBINE == 0:
        out = tl.reduce(x, AXIS, _add, keep_dims=KEEP)
    elif COMBINE == 1:
        out = tl.reduce(x, AXIS, _lopsided, keep_dims=KEEP)
    else:
        index = tl.zeros_like(x).to(tl.int32) + tl.arange(0, x.shape[1])[None, :]
        out, _ = tl.reduce((x, index), AXIS, _keep_larger, keep_dims=KEEP)
    return out


@triton.jit
def reduce_kernel(x_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, AXIS: tl.constexpr, COMBINE: tl.constexpr,
                  KEEP: tl.constexpr):
    """out = the reduction of the [M, N] x along AXIS (0, 1, or -1 for the whole tensor)."""
    x = tl.load(x_ptr + tl.arange(0, M)[:, None] * N + tl.arange(0, N)[None, :])
    if AXIS == 0:
        tl.store(out_ptr + tl.arange(0, N), tl.reshape(_reduced(x, 0, COMBINE, KEEP), [N]))
    elif AXIS == 1:
        tl.store(out_ptr + tl.arange(0, M), tl.reshape(_reduced(x, 1, COMBINE, KEEP), [M]))
    elif KEEP:
        tl.store(out_ptr + tl.arange(0, 1), tl.reshape(_reduced(x, None, COMBINE, KEEP), [1]))
    else:
        tl.store(out_ptr, _reduced(x, None, COMBINE, KEEP))
