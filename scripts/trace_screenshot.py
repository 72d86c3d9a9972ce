"""Render docs/trace-viewer.png: the trace viewer on a real engine run of a synthetic SmolLM2-shaped model.

    python scripts/trace_screenshot.py [--out docs/trace-viewer.png] [--tokens 32] [--keep trace.json]

Needs the system Chromium (apt-get install chromium) and Playwright for Python (pip install playwright);
no model file: the run is `minfer trace demo`'s (minfer.commands.trace.run_demo) on `minfer synth
smollm2-135m q4_1` (SmolLM2-135M's shapes and tokenizer, random weights), recorded by the engine.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from urllib.parse import quote

from minfer.commands.trace import run_demo
from minfer.trace.browser import screenshot_viewer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "docs" / "trace-viewer.png"))
    ap.add_argument("--tokens", type=int, default=32, help="steps to record (1 prefill + decodes)")
    ap.add_argument("--step", type=int, default=8, help="step shown in the screenshot")
    ap.add_argument("--node", default="blk.12.ffn_gate+up", help="node shown in the inspector")
    ap.add_argument("--keep", help="also keep the trace JSON at this path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(args.keep) if args.keep else Path(tmp) / "trace.json"
        run_demo(trace, preset="smollm2-135m", quant="q4_1", new_tokens=args.tokens, seed=1, vocab=None)
        out = screenshot_viewer(trace, args.out, query=f"&step={args.step}&node={quote(args.node)}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
