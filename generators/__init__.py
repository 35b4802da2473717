"""Case generators: seeded bulk drawing (tensors), curated edges (cases), hypothesis strategies."""

from generators.cases import default_specs, edge_cases
from generators.spec import CaseSpec, LengthDist, Stale, Values
from generators.tensors import build_case, random_cases

__all__ = ["CaseSpec", "LengthDist", "Stale", "Values", "build_case", "default_specs", "edge_cases",
           "random_cases"]
