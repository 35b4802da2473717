"""`python -m difftest`: the difftest command, as installed (difftest.cli.entry)."""

import sys

from difftest.cli import entry

sys.exit(entry())
