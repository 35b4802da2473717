"""What a ragged logits backend is (the sibling of difftest.backends.base.Backend for the ragged operation), the
tolerance the serving engines' bf16 torch references are held to, and how such a reference is loaded from its
release's file without its package.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from difftest.backends import carried
from difftest.core import hardware
from difftest.core.triton_interpret import load_kernel_defs

if TYPE_CHECKING:
    import torch

    from difftest.core.ragged import RaggedContract, RaggedInputs


@runtime_checkable
class RaggedBackend(Protocol):
    """A ragged (prefill) MQA logits kernel under test, called the way its production callers call it."""

    name: str
    contract: RaggedContract

    def unavailable_reason(self, device: str) -> str | None:
        """Why this backend cannot run on `device` ("cpu", "cuda"), or None when it can."""
        ...

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """Logits in the contract's form ([rows, keys] or [rows, max_seqlen_k]); `out` is a poisoned buffer of
        that shape when contract.writes_into_output, else None."""
        ...


# vLLM's and SGLang's torch references take each head's dot q . k in bf16: the fp8 products are exact and
# summed in fp32, then the dot d_h is rounded to bf16, |error| <= 2^-8 |d_h|; ReLU, weights, head sum and scale
# are fp32. A logit errs by at most 2^-8 * s * sum_h |w_h| |d_h|: relative to the row's largest |logit|,
# 2^-8 * R with R = max_p s_p sum_h |w_h| |d_h| / max_p |logit_p|, how much the heads' signed weights cancel.
# R is not bounded, so no rtol is rigorous; the roundings do not all go one way, though, and the paged
# references' largest error over 1080 drawn cases was 1.4e-2 of the row's largest logit (difftest.backends.sglang).
# 2^-8 * 16 = 6.25e-2 leaves a factor of 4 above that; a wrong window, key or scale is off by far more.
BF16_DOT_RTOL = 2.0 ** -8 * 16


@dataclasses.dataclass(frozen=True)
class CarriedReference:
    """A ragged logits function of plain torch that lives in one file of a package that cannot be imported here
    (vLLM, sglang: half a serving framework): found on sys.path (difftest.backends.carried), the function alone
    executed from it (difftest.core.triton_interpret.load_kernel_defs) with `torch` as its only global, and
    called by `call`, as its production caller calls it. CPU and GPU."""

    name: str
    files: tuple[str, ...]  # where the file lies in the release's tree
    function: str
    release: str  # 'vllm 0.33.0': where scripts/prepare_field_deps.py takes the file from
    version_files: tuple[str, ...]
    contract_of: Callable[[str], RaggedContract]  # the contract, given the library's description
    call: Callable[[Callable[..., torch.Tensor], RaggedInputs], torch.Tensor]

    @property
    def contract(self) -> RaggedContract:
        """The envelope; `library` names the copy of the file found."""
        found = carried.find(self.files)
        if found is None:
            return self.contract_of(f"{self.release.split()[0]} (no copy of {self.files[0]} on sys.path)")
        version = found.version(self.version_files) or "(version unknown)"
        return self.contract_of(f"{self.release.split()[0]} {version} ({self.function} from {found.path}, "
                                f"{self.release.split()[0]} not imported)")

    def unavailable_reason(self, device: str) -> str | None:
        """Why it cannot run on `device`: no GPU, no copy of the file, or a file without the function."""
        why = hardware.cuda_unavailable_reason() if device == "cuda" else None
        if why:
            return why
        try:
            self._function()
        except (LookupError, SyntaxError, OSError) as exc:
            return str(exc) if isinstance(exc, FileNotFoundError) else \
                f"loading {self.function} failed: {type(exc).__name__}: {exc}"
        return None

    def __call__(self, inputs: RaggedInputs, out: torch.Tensor | None) -> torch.Tensor:
        """The function's logits, as its caller receives them."""
        return self.call(self._function(), inputs)

    def _function(self) -> Callable[..., torch.Tensor]:
        found = carried.find(self.files)
        if found is None:
            raise FileNotFoundError(carried.missing_reason(self.files, self.release))
        import torch  # deferred: listing backends does not import torch

        module = f"difftest_{self.name.replace('-', '_')}_{zlib.crc32(str(found.path).encode()):08x}"
        return getattr(load_kernel_defs(found.path, (self.function,), module, False, {"torch": torch}), self.function)
