"""`minfer inspect` on the default model: the numbers the foundation issue asks for."""

from __future__ import annotations

import json

from minfer.cli import main


def test_inspect_smollm2_json(smollm2_path, capsys):
    assert main(["inspect", str(smollm2_path), "--json", "--tensors"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["architecture"] == "llama"
    assert s["n_layers"] == 30
    assert s["n_tensors"] == 272 == len(s["tensors"])
    assert s["quant_mix"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert s["context_length"] == 8192
    assert s["tokenizer"]["model"] == "gpt2" and s["tokenizer"]["n_vocab"] == 49152
    assert s["chat_template"] is True
    assert s["tokenizer"]["special_tokens"]["eos"] == {"id": 2, "text": "<|im_end|>"}
    # parameter count = sum of element counts; bytes match each type's block size
    assert s["n_params"] == sum(_elems(t["shape"]) for t in s["tensors"]) == 134_515_008
    emb = next(t for t in s["tensors"] if t["name"] == "token_embd.weight")
    assert emb == {"name": "token_embd.weight", "shape": [576, 49152], "type": "Q8_0", "bytes": 576 * 49152 // 32 * 34}


def _elems(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def test_inspect_text(smollm2_path, capsys):
    assert main(["inspect", str(smollm2_path)]) == 0
    out = capsys.readouterr().out
    assert "architecture   llama" in out and "Q4_1 ×210, F32 ×61, Q8_0 ×1" in out


def test_inspect_bad_file_is_a_typed_error(tmp_path, capsys):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"GGUF" + b"\x07\x00\x00\x00" + b"\x00" * 40)
    assert main(["inspect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "version" in err and "not supported" in err
