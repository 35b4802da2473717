"""What a run leaves: results as JSON and JSONL, reproducer bundles, the printed report, JUnit XML and
the known-divergence ledger."""
