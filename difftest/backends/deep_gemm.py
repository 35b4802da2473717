"""DeepGEMM's paged MQA logits, called as vLLM 0.33's indexer calls it (DOMAIN.md section 4).

    meta = get_paged_mqa_logits_metadata(context_lens, block_size, num_sms[, indices])
    logits = fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table,
                                      meta, max_model_len[, indices])

Three variants, so they can be compared with each other as well as with the oracle:
* deepgemm           native MTP: (B, next_n) lengths; sm90 takes next_n in {1, 2, 4}, and at
                     next_n = 4 the schedule is built for num_sms // 2 slots.
* deepgemm-flattened every draft row as its own request of next_n = 1, (T, 1) lengths and the
                     block-table rows repeated: what vLLM does for next_n the kernel cannot take.
* deepgemm-varlen    flattened rows plus `indices` (request id per row); sm100 only.
"""

from __future__ import annotations

import functools
import importlib
from types import ModuleType

import torch

from difftest.contract import Contract
from difftest.encode import KernelInputs
from difftest.kinds import CacheLayout, LengthEncoding, MaskConvention

SM90_NATIVE_NEXT_N = (1, 2, 4)
_MODULES = ("deep_gemm", "vllm.third_party.deep_gemm")


@functools.cache
def load_deep_gemm() -> tuple[ModuleType | None, str]:
    """(the module, how it was found) or (None, why not), trying the standalone then vLLM's copy."""
    errors = []
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # a broken build raises more than ImportError
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        if hasattr(module, "fp8_fp4_paged_mqa_logits") or hasattr(module, "fp8_paged_mqa_logits"):
            return module, f"{name} {getattr(module, '__version__', '?')}"
        errors.append(f"{name}: has no paged MQA logits entry point")
    return None, "; ".join(errors)


def _library_name() -> str:
    module, how = load_deep_gemm()
    return how if module is not None else "deep_gemm (not importable)"


def arch() -> str:
    """'sm90', 'sm100', ... of the current CUDA device."""
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def _module() -> ModuleType:
    module, how = load_deep_gemm()
    if module is None:
        raise RuntimeError(f"DeepGEMM not importable: {how}")
    return module


def _logits_fn(module: ModuleType):
    # 2.x renamed fp8_paged_mqa_logits when FP4 keys arrived; older installs only have the old name.
    return getattr(module, "fp8_fp4_paged_mqa_logits", None) or module.fp8_paged_mqa_logits


class _DeepGemmBase:
    name = "deepgemm"
    encoding = LengthEncoding.PER_ROW
    archs: tuple[str, ...] = ("sm90", "sm100", "sm103")

    @property
    def contract(self) -> Contract:
        wide = torch.cuda.is_available() and arch() != "sm90"
        return Contract(
            length_encoding=self.encoding, cache_layout=CacheLayout.BLOCK_SPLIT,
            mask=MaskConvention.TAIL_UNSPECIFIED, devices=("cuda",), archs=self.archs,
            next_n=self._next_n(), head_dims=(32, 64, 128), block_sizes=(32, 64),
            output_dtype=torch.bfloat16 if wide else torch.float32,
            # FP8 MMA accumulates with ~14 bits (and bf16 output on sm100): on the H200 the largest
            # error of a correct result was 3.0e-3 of the row's largest logit (reports/h200/14-*),
            # a row with another request's q was off by 0.5 or more (13-zero-length-straddle).
            rtol=1e-2, library=_library_name())

    def _next_n(self) -> tuple[int, ...] | None:
        return None

    def unavailable_reason(self, device: str) -> str | None:
        if device != "cuda":
            return f"DeepGEMM runs on CUDA GPUs only (device {device})"
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False"
        module, how = load_deep_gemm()
        if module is None:
            return f"DeepGEMM not importable ({how})"
        if arch() not in self.archs:
            return f"{self.name} needs {'/'.join(self.archs)}, this GPU is {arch()}"
        return None

    def num_sms(self, module: ModuleType, next_n: int) -> int:
        sms = module.get_num_sms()
        # sm90's MTP kernel at next_n = 4 runs two query atoms per SM: half the schedule slots.
        return sms // 2 if arch() == "sm90" and next_n == 4 else sms

    def __call__(self, inputs: KernelInputs, out: torch.Tensor | None) -> torch.Tensor:
        return self.launch(inputs, self.schedule(inputs))

    def schedule(self, inputs: KernelInputs) -> torch.Tensor:
        """The schedule metadata vLLM builds once per step from the step's lengths."""
        module = _module()
        slots = self.num_sms(module, inputs.q.shape[1])
        return module.get_paged_mqa_logits_metadata(self.context_lens(inputs), inputs.block_size, slots,
                                                    *self.extra(inputs))

    def launch(self, inputs: KernelInputs, schedule: torch.Tensor) -> torch.Tensor:
        """The logits kernel alone, on a schedule from `schedule()`."""
        return _logits_fn(_module())((inputs.q, None), inputs.kv_cache, inputs.weights,
                                     self.context_lens(inputs), inputs.block_table, schedule,
                                     inputs.max_model_len, *self.extra(inputs))

    def context_lens(self, inputs: KernelInputs) -> torch.Tensor:
        return inputs.context_lens

    def extra(self, inputs: KernelInputs) -> tuple[torch.Tensor, ...]:
        return ()


class DeepGemmNative(_DeepGemmBase):
    """Native MTP: one (B, next_n) length table, next_n query rows per request."""

    name = "deepgemm"
    encoding = LengthEncoding.PER_ROW

    def _next_n(self) -> tuple[int, ...] | None:
        return SM90_NATIVE_NEXT_N if torch.cuda.is_available() and arch() == "sm90" else None


class DeepGemmFlattened(_DeepGemmBase):
    """Every draft row a request of its own (next_n = 1); any next_n."""

    name = "deepgemm-flattened"
    encoding = LengthEncoding.FLATTENED

    def context_lens(self, inputs: KernelInputs) -> torch.Tensor:
        # DeepGEMM 2.x requires 2-D lengths even at next_n = 1: vLLM passes (T, 1).
        return inputs.context_lens.reshape(-1, 1)


class DeepGemmVarlen(_DeepGemmBase):
    """Flattened rows plus the request index of each row: the sm100 path vLLM's metadata targets."""

    name = "deepgemm-varlen"
    encoding = LengthEncoding.FLATTENED_INDICES
    archs = ("sm100", "sm103")

    def context_lens(self, inputs: KernelInputs) -> torch.Tensor:
        return inputs.context_lens.reshape(-1, 1)

    def extra(self, inputs: KernelInputs) -> tuple[torch.Tensor, ...]:
        assert inputs.indices is not None
        return (inputs.indices,)
