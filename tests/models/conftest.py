"""Models the model tests share: SmolLM2 loaded once per session, tiny synthetic GGUFs on demand."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_model(smollm2_path):
    """The default model on cpu, loaded once (context 1024: room for perplexity's 512 chunks)."""
    from minfer.api import load

    with load(smollm2_path, n_ctx=1024, progress=False) as m:
        yield m


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    """tiny_gguf(preset, quant) -> path of a synthetic model (minfer synth), written once."""
    from minfer.gguf.synth import synth

    root = tmp_path_factory.mktemp("tiny")
    made: dict[tuple[str, str], Path] = {}

    def get(preset: str = "tiny-llama", quant: str = "f32") -> Path:
        if (preset, quant) not in made:
            made[preset, quant] = synth(preset, quant, root / f"{preset}-{quant}.gguf", progress=False)
        return made[preset, quant]

    return get


@pytest.fixture(scope="session")
def rewrite_gguf():
    """rewrite_gguf(src, dst, drop=(), meta={}, shapes={}, add=()) -> dst: a copy of a GGUF with
    tensors dropped, metadata values replaced or added (key -> (ValueType, value)), tensors
    re-declared with another shape of the same size, or tensors added ((name, shape, type, bytes))."""
    from minfer.gguf.reader import GGUFReader, ValueType
    from minfer.gguf.writer import write_gguf

    def rewrite(src, dst, *, drop=(), meta=None, shapes=None, add=()):
        meta, shapes = dict(meta or {}), shapes or {}
        with GGUFReader(src) as r:
            md = []
            for k, kv in r.kv.items():
                if k in meta:
                    new = meta.pop(k)
                    md.append((k, *new) if isinstance(new, tuple) else (k, kv.type, new))
                elif kv.type == ValueType.ARRAY:
                    md.append((k, kv.type, (kv.elem_type, kv.value)))
                else:
                    md.append((k, kv.type, kv.value))
            md += [(k, *v) for k, v in meta.items()]
            tensors = [(n, shapes.get(n, t.shape), t.ggml_type, bytes(r.tensor_bytes(n)))
                       for n, t in r.tensors.items() if n not in drop]
        return write_gguf(dst, md, tensors + list(add))

    return rewrite
