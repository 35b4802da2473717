"""`python -m difftest`: the difftest command."""

import sys

from difftest.cli import main

sys.exit(main())
