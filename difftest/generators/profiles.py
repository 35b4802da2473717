"""difftest's hypothesis settings profiles. Imports hypothesis alone (no torch), so the pytest plugin
can register them before hypothesis' own plugin loads the one `--hypothesis-profile` names.

None has a deadline: hypothesis times every example against it (200 ms by default), and a kernel's
first call imports and compiles (0.7 s is usual on a CPU), so the first example would fail as
DeadlineExceeded and its fast replay as Flaky, and the bug itself would be lost.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

CI_PROFILE, NIGHTLY_PROFILE, DEV_PROFILE = "difftest-ci", "difftest-nightly", "difftest-dev"
PROFILES = (CI_PROFILE, NIGHTLY_PROFILE, DEV_PROFILE)


def register_profiles() -> None:
    """Register the three profiles (again, harmlessly, if they are already).

    difftest-ci: 30 derandomized examples, no example database, so CI runs are repeatable;
    difftest-nightly: 1000 random examples; difftest-dev: hypothesis' defaults without the deadline.
    """
    slow_ok = [HealthCheck.too_slow]
    settings.register_profile(CI_PROFILE, max_examples=30, deadline=None, derandomize=True, database=None,
                              print_blob=True, suppress_health_check=slow_ok)
    settings.register_profile(NIGHTLY_PROFILE, max_examples=1000, deadline=None, print_blob=True,
                              suppress_health_check=slow_ok)
    settings.register_profile(DEV_PROFILE, deadline=None)
