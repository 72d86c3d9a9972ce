"""`python -m minfer ...` = the `minfer` command (what `torchrun -m minfer ...` runs on every rank)."""

import sys

from .cli import main

sys.exit(main())
