"""The engine: plans which cases a run draws, runs every backend on every case (guarded, optionally in
worker processes), compares each row with the oracle's and gives every result its verdict."""
