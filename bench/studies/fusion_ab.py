"""One fusion off at a time, on the same tree: runs a `minfer` command (usually `bench`) with the
named fusions removed. Not a test; a study for the device (bench/h200_driver.sh PARTS=fusionab).

Usage: python bench/studies/fusion_ab.py VARIANT minfer-args...
  VARIANT: "all" (the tree as it is) or a comma list of what to drop:
    a graph/fuse.py rule by its name without `fuse_` (moe_router, moe_sum, norm_rope, ...), or
    attn_combine: the split decode attention's last-arriver combine (kernels/triton/attention.py)
    replaced by its separate combine kernel, as before stop 48.

e.g. python bench/studies/fusion_ab.py moe_router,moe_sum bench -m q.gguf --device cuda -p 512 -n 128 --json

Stop 49 measured a last-arriver tail slower than the kernels it replaced (under CUDA graphs + PDL it
keeps the grid-wide wait and loses the overlap): this tells which of stop 48's last-arriver fusions
(MoERouter, MoEMatMulSum, the attention's combine) earn their place, each against the same tree.
"""

from __future__ import annotations

import sys

from minfer import cli
from minfer.graph import fuse
from minfer.kernels.triton import attention


def apply(variant: str) -> None:
    """Remove the variant's fusions (module state of this process only)."""
    if variant == "all":
        return
    rules = {r.__name__.removeprefix("fuse_"): r for r in fuse.FUSIONS}
    for name in variant.split(","):
        if name == "attn_combine":
            attention.COMBINE_MAX_SPLITS = 1  # any split attention then runs the combine kernel
        elif name in rules:
            fuse.FUSIONS = tuple(r for r in fuse.FUSIONS if r is not rules[name])
        else:
            sys.exit(f"fusion_ab: unknown variant part {name!r}; known: all, attn_combine, {', '.join(rules)}")


if __name__ == "__main__":
    apply(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
