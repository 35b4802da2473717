"""Case generators: seeded bulk drawing (tensors), curated edges (cases), hypothesis strategies."""

from generators.cases import default_specs, edge_cases
from generators.spec import CaseSpec, LengthDist, Stale, Values
from generators.strategies import cases, register_profiles, specs
from generators.tensors import build_case, random_cases

__all__ = ["CaseSpec", "LengthDist", "Stale", "Values", "build_case", "cases", "default_specs", "edge_cases",
           "random_cases", "register_profiles", "specs"]
