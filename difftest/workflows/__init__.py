"""What a user runs: a session (`difftest run`), a fuzz campaign, shrinking and replaying a bundle, a run
spread over GPUs, and `check()` for a test."""
