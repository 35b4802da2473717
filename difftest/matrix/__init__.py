"""The CI matrix: a matrix file's cells (device kinds x library versions x backends x suites), the CI
configuration that runs them, one cell's run, and the merged report of every cell."""
