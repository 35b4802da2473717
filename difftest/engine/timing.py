"""Kernel timing (`difftest run --time K`): the median of K launches of a backend's per-layer call.

Kept out of the correctness path: difftest.engine.guards times a backend only after its checked launches
and their input checksums, on the same inputs, without poisoning (production allocations are not
poisoned either); what is measured here never reaches a verdict, and a timing launch that raises
leaves the verdict as it was and says so in `Timing.error`.

What is timed is the call as its production caller issues it per layer: a backend's `prepare`
(difftest.backends.base.Preparable) builds what that caller builds once per batch (DeepGEMM's
schedule metadata) outside the timed region; a backend without one is timed whole (TimedRegion).

The method, on CUDA (that of triton.testing.do_bench, in outline):
* WARMUP untimed launches first: JIT compilation (Triton, DeepGEMM's runtime-compiled kernels),
  lazy module loading and the caching allocator's first allocations stay out of the median;
* synchronise, so work queued before the first timed launch is not counted in it;
* before each timed launch, an L2 flush: a buffer larger than any current GPU's L2 is zeroed,
  outside the events. In a decode step the other layers' kernels run between two indexer calls and
  evict the cache; back-to-back launches on the same inputs would find the keys still in L2 and
  time a best case production never sees;
* a torch.cuda.Event pair around each launch on the current stream and one synchronise at the end:
  the GPU's time between the events, not the host's. A launch whose host-side work outlasts the
  flush before it shows that excess too, as an idle GPU between the events.
On the CPU, time.perf_counter around each launch after the same warm-up, with no cache flush: CPU
cases are toy-sized and their timings are for comparing backends with each other.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable

import torch

from difftest.backends.base import Backend, launcher, timed_region
from difftest.core.contract import Siblings
from difftest.core.kernel_inputs import KernelInputs
from difftest.core.kinds import TimedRegion, TimingMethod
from difftest.core.schema import Bool, Int, Member, NonNegative, Record, Text
from difftest.engine.config import MAX_TIME

WARMUP = 2  # untimed launches before the timed ones
# Zeroed before each timed CUDA launch: 256 MiB, as triton.testing.do_bench, over four times the
# L2 of an H100 (50 MiB) or H200 (60 MiB).
L2_FLUSH_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class Timing(Record):
    """K timed launches of one backend on one case, in seconds per launch."""

    method: Member(TimingMethod)
    region: Member(TimedRegion)  # the per-layer kernel call, or the whole call (no prepare declared)
    launches: Int(1, MAX_TIME)  # timed launches, after WARMUP untimed ones
    median: NonNegative  # NaN when `error`
    minimum: NonNegative
    maximum: NonNegative
    l2_flush: Bool  # whether the L2 was flushed before each timed launch
    siblings: Siblings | None = None  # the backend's declared sibling group (the performance differential)
    error: Text() | None = None  # a timing launch raised: no numbers; the verdict stands


def time_launches(backend: Backend, inputs: KernelInputs, out: torch.Tensor | None, launches: int) -> Timing:
    """Median, minimum and maximum of `launches` timed launches of `backend` on `inputs` (`out`: the
    buffer of a backend that writes into one). Never raises for the backend's faults."""
    device = inputs.q.device
    cuda = device.type == "cuda"
    method = TimingMethod.CUDA_EVENTS if cuda else TimingMethod.PERF_COUNTER
    facts = dict(method=method, region=timed_region(backend), launches=launches, l2_flush=cuda,
                 siblings=backend.contract.siblings)
    try:
        call = launcher(backend, inputs, out)
        samples = _cuda_samples(call, launches, device) if cuda else _cpu_samples(call, launches)
    except Exception as exc:  # the backend's fault, reported with the timing; its verdict is already made
        return Timing(median=math.nan, minimum=math.nan, maximum=math.nan,
                      error=f"{type(exc).__name__}: {exc}", **facts)
    return Timing(median=statistics.median(samples), minimum=min(samples), maximum=max(samples), **facts)


def _cpu_samples(call: Callable[[], torch.Tensor], launches: int) -> list[float]:
    """Seconds of each of `launches` calls, after WARMUP untimed ones."""
    for _ in range(WARMUP):
        call()
    samples = []
    for _ in range(launches):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return samples


def _cuda_samples(call: Callable[[], torch.Tensor], launches: int, device: torch.device) -> list[float]:
    """GPU seconds of each of `launches` calls between a pair of CUDA events, the L2 flushed before
    each (outside its events), after WARMUP untimed calls."""
    with torch.cuda.device(device):
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(launches)]
        for _ in range(WARMUP):
            call()
        torch.cuda.synchronize(device)
        for start, end in events:
            flush.zero_()
            start.record()
            call()
            end.record()
        torch.cuda.synchronize(device)
    return [start.elapsed_time(end) / 1e3 for start, end in events]  # elapsed_time is in milliseconds
