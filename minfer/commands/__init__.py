"""The `minfer` subcommands: one module per command (or family), each with `add_parser(sub)`.

Modules import only argparse and torch-free parts of minfer at import time; a command imports
what it runs (torch, the engine) when it runs, so `minfer --help` and `minfer inspect` start fast.
"""

MODULES = ("run", "chat", "batch", "serve", "perplexity", "bench", "plan", "inspect", "synth", "kernels", "trace",
           "devices", "models", "ps")
