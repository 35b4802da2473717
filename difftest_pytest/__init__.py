"""difftest's pytest plugin: `difftest_backend` and `difftest_case` fixtures of every operation (`--difftest-op`),
`difftest.workflows.checking`'s row-table and headline failures, hardware markers, `--difftest-suite`, a
known-divergence ledger, and xdist.

The plugin lives in difftest_pytest.plugin (entry point `difftest` in pytest11); importing this
package imports neither torch nor difftest.
"""
