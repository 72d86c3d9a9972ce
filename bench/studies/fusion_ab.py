"""One fusion off at a time, on the same tree: runs a `minfer` command (usually `bench`) with the
named graph/fuse.py rules removed. Not a test; a study for the device, run by hand.

Usage: python bench/studies/fusion_ab.py VARIANT minfer-args...
  VARIANT: "all" (the tree as it is) or a comma list of the rules to drop, each by its name without
    `fuse_` (moe_glu, norm_rope, int8_x, ...).

e.g. python bench/studies/fusion_ab.py moe_glu bench -m q.gguf --device cuda -p 512 -n 128 --json

Stop 50 used it (through the device driver, with the attention's last-split combine as a variant
too) to measure stop 48's last-arriver fusions each against the same tree on an H100: the router +
routing (moe_router), the down experts + weighted sum (moe_sum) and the combine did not win, and were
removed (bench/NOTES.md stop 50). The device driver's PARTS=dnorm uses it to run models without the
deferred RMSNorm (matmul_add_norm) beside the tree as it is.
"""

from __future__ import annotations

import sys

from minfer import cli
from minfer.graph import fuse


def apply(variant: str) -> None:
    """Remove the variant's fusions (module state of this process only)."""
    if variant == "all":
        return
    rules = {r.__name__.removeprefix("fuse_"): r for r in fuse.FUSIONS}
    for name in variant.split(","):
        if name not in rules:
            sys.exit(f"fusion_ab: unknown variant part {name!r}; known: all, {', '.join(rules)}")
        fuse.FUSIONS = tuple(r for r in fuse.FUSIONS if r is not rules[name])


if __name__ == "__main__":
    apply(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
