"""difftest: proves or disproves, row by row, that a paged MQA logits kernel computes what it should.

Cases (generators) go through the oracle and every backend; the comparison reports, per row, a
wrong -inf mask, NaN, unwritten output or a value error, under each backend's declared contract.
"""

from difftest.backends import Backend, get_backends, load_backend
from difftest.backends.user import backend
from difftest.case import Case
from difftest.check import check
from difftest.compare import Comparison, compare
from difftest.contract import Contract
from difftest.encode import KernelInputs, encode
from difftest.errors import SpecError
from difftest.kinds import CacheLayout, Fp8Flavour, LengthEncoding, MaskConvention
from difftest.runner import CaseResult, RunConfig, run
from difftest.verdict import Verdict

__version__ = "0.1.0"

__all__ = ["Backend", "CacheLayout", "Case", "CaseResult", "Comparison", "Contract", "Fp8Flavour",
           "KernelInputs", "LengthEncoding", "MaskConvention", "RunConfig", "SpecError", "Verdict",
           "backend", "check", "compare", "encode", "get_backends", "load_backend", "run"]
