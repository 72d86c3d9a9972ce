"""`minfer synth`: shapes, quant mixes, weights and tokenizer of synthetic models.

Oracles: the real SmolLM2 file (its tensor table and keys), the published parameter counts of
the four real models, the `gguf` package (reader and dequantizers), HF `tokenizers` (BPE and
GPT-2's byte alphabet) and, where installed, HF `transformers` loading the files.
"""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from minfer.cli import main
from minfer.errors import UnsupportedError
from minfer.gguf import synth as synth_mod
from minfer.gguf.reader import GGUFReader
from minfer.gguf.synth import (
    PRESETS,
    QUANTS,
    byte_to_unicode,
    model_metadata,
    plan_tensors,
    random_blocks,
    spm_vocab,
    synth,
    synth_vocab,
)
from minfer.quant.types import GGMLType

G = GGMLType


def _dequant(raw, qtype) -> np.ndarray:
    return dequantize(np.asarray(raw, dtype=np.uint8).reshape(-1), gguf.GGMLQuantizationType(int(qtype)))


def test_smollm2_plan_is_the_real_files_tensor_table(smollm2_path):
    r = GGUFReader(smollm2_path)
    real = {(t.name, t.shape, t.ggml_type) for t in r.tensors.values()}
    ours = {(n, s, t) for n, s, t, _ in plan_tensors(PRESETS["smollm2-135m"], "q4_1")}
    assert ours == real


def test_smollm2_metadata_mirrors_the_real_file(smollm2_path):
    r = GGUFReader(smollm2_path)
    md = model_metadata(PRESETS["smollm2-135m"], "q4_1", seed=0)
    descriptive = {"general.name", "general.organization", "general.finetune", "general.basename",
                   "general.size_label", "general.license", "general.languages"}
    assert set(r.kv) - set(md) == descriptive - {"general.name"}
    for key in r.kv:
        if key in descriptive or key.startswith("tokenizer.") and key != "tokenizer.ggml.model":
            continue
        want = np.float32(r.metadata[key]) if isinstance(r.metadata[key], float) else r.metadata[key]
        assert md[key] == want, key
    for key in ("model", "pre", "bos_token_id", "eos_token_id", "padding_token_id", "add_bos_token"):
        assert md[f"tokenizer.ggml.{key}"] == r.metadata[f"tokenizer.ggml.{key}"], key
    assert len(md["tokenizer.ggml.tokens"]) == len(r.metadata["tokenizer.ggml.tokens"]) == 49152
    assert md["tokenizer.ggml.tokens"][:3] == r.metadata["tokenizer.ggml.tokens"][:3]


@pytest.mark.parametrize("preset,n_params", [
    ("smollm2-135m", 134_515_008), ("qwen2.5-0.5b", 494_032_768),
    ("qwen2.5-7b", 7_615_616_512), ("llama3-8b", 8_030_261_248), ("llama3-70b", 70_553_706_496),
    ("qwen3-0.6b", 596_049_920), ("qwen3-8b", 8_190_735_360), ("gemma3-270m", 268_098_176),
    ("gemma3-1b", 999_885_952), ("gemma2-2b", 2_614_341_888),
    ("phi3-mini", 3_821_079_552 + 2 * 48),  # + the two LongRoPE factor vectors (not counted in the published number)
])
def test_parameter_counts_match_the_published_models(preset, n_params):
    assert sum(math.prod(s) for _, s, _, _ in plan_tensors(PRESETS[preset], "q4_0")) == n_params


def _types_by_role(preset: str, quant: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, _, t, role in plan_tensors(PRESETS[preset], quant):
        out.setdefault(name.split(".")[-2] if role == "matrix" else role, set()).add(t.name)
    return out


def test_quant_mixes():
    assert _types_by_role("tiny-qwen2", "q4_k") == {
        "token_embd": {"Q4_K"}, "output": {"Q6_K"}, "norm": {"F32"}, "bias": {"F32"}, "attn_q": {"Q4_K"},
        "attn_k": {"Q4_K"}, "attn_v": {"Q4_K"}, "attn_output": {"Q4_K"}, "ffn_gate": {"Q4_K"},
        "ffn_up": {"Q4_K"}, "ffn_down": {"Q4_K"}}
    assert _types_by_role("tiny-llama", "q4_k")["token_embd"] == {"Q6_K"}  # tied: it is the output
    assert _types_by_role("tiny-llama", "q4_1")["token_embd"] == {"Q8_0"}
    assert _types_by_role("tiny-qwen2", "q4_1")["output"] == {"Q4_1"}
    # SmolLM2's d = 576 is not a multiple of 256: llama.cpp's fallbacks, Q4_K -> Q5_0, Q6_K -> Q8_0
    smol = _types_by_role("smollm2-135m", "q4_k")
    assert smol["token_embd"] == {"Q8_0"} and smol["attn_q"] == {"Q5_0"} and smol["ffn_down"] == {"Q4_K"}
    # Q4_K_M's mix: attn_v and ffn_down Q6_K in the first and last eighth of the layers and every third
    m = {name: t.name for name, _, t, _ in plan_tensors(PRESETS["llama3-8b"], "q4_k_m")}
    more = [i for i in range(32) if m[f"blk.{i}.attn_v.weight"] == "Q6_K"]
    assert more == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]
    assert all(m[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if i in more else "Q4_K") for i in range(32))
    assert {m[f"blk.{i}.attn_q.weight"] for i in range(32)} == {"Q4_K"} and m["output.weight"] == "Q6_K"
    assert _types_by_role("tiny-llama", "q5_k_m")["attn_v"] == {"Q5_K", "Q6_K"}
    # the lookup types: IQ4 mixes as the K mixes (Q6_K output; IQ4_XS -> IQ4_NL where a row is not whole
    # super-blocks), MXFP4 matrices with Q8_0 output and token_embd
    iq4 = _types_by_role("smollm2-135m", "iq4_xs")
    assert iq4["token_embd"] == {"Q8_0"} and iq4["attn_q"] == {"IQ4_NL"} and iq4["ffn_down"] == {"IQ4_XS"}
    assert _types_by_role("tiny-qwen2", "iq4_nl")["output"] == {"Q6_K"}
    mx = _types_by_role("tiny-qwen2", "mxfp4")
    assert mx["output"] == mx["token_embd"] == {"Q8_0"} and mx["ffn_up"] == mx["attn_k"] == {"MXFP4"}
    for q in ("q4_0", "q8_0", "q6_k", "q5_0", "q5_1", "f16", "f32"):
        roles = _types_by_role("qwen2.5-7b", q)
        assert roles.pop("norm") == roles.pop("bias") == {"F32"}
        assert set().union(*roles.values()) == {q.upper()}


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_tiny_files_load_with_sane_weights(tiny_file, preset, quant):
    r = GGUFReader(tiny_file(preset, quant))
    plan = plan_tensors(PRESETS[preset], quant)
    assert [(t.name, t.shape, t.ggml_type) for t in r.tensors.values()] == [(n, s, t) for n, s, t, _ in plan]
    assert r.get_int(f"{PRESETS[preset].arch}.block_count") == 2
    for name, shape, qtype, role in plan:
        x = _dequant(r.tensor_bytes(name), qtype)
        assert x.size == math.prod(shape) and np.isfinite(x).all(), name
        if role == "norm":
            assert abs(x.mean() - 1) < 0.05, name
        else:
            assert 0.015 < x.std() < 0.03 and abs(x.mean()) < 0.005, (name, x.std(), x.mean())


@pytest.mark.parametrize("quant", ["f32", "f16"])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen2"])
def test_gguf_package_reads_tiny_files(tiny_file, preset, quant):
    path = tiny_file(preset, quant)
    ours, theirs = GGUFReader(path), gguf.GGUFReader(path)
    assert {k for k in theirs.fields if not k.startswith("GGUF.")} == set(ours.kv)
    assert theirs.fields["tokenizer.ggml.merges"].contents() == ours.metadata["tokenizer.ggml.merges"]
    assert [t.name for t in theirs.tensors] == list(ours.tensors)
    for t in theirs.tensors:
        assert tuple(int(n) for n in t.shape) == ours.tensors[t.name].shape
        assert t.data.tobytes() == ours.tensor_bytes(t.name).tobytes()


def test_random_blocks_have_realistic_magnitude():
    rng = np.random.Generator(np.random.SFC64(7))
    for qtype in (G.Q4_0, G.Q4_1, G.Q5_0, G.Q5_1, G.Q8_0, G.Q2_K, G.Q3_K, G.Q4_K, G.Q5_K, G.Q6_K, G.IQ4_NL, G.IQ4_XS,
                  G.MXFP4, G.F16, G.F32):
        x = _dequant(random_blocks(rng, qtype, 2048), qtype)
        assert np.isfinite(x).all() and 0.015 < x.std() < 0.03, (qtype.name, x.std())
        assert abs(x.mean()) < 0.003, (qtype.name, x.mean())
    with pytest.raises(UnsupportedError, match="BF16"):
        random_blocks(rng, G.BF16, 1)


def test_big_preset_streams_in_chunks(tmp_path, monkeypatch):
    """The random-block path of the big presets, with chunks small enough to split tensors."""
    monkeypatch.setattr(synth_mod, "CHUNK_BYTES", 1 << 16)
    path = synth("smollm2-135m", "q4_k", tmp_path / "s.gguf", vocab=1024, progress=False)
    r = GGUFReader(path)
    assert r.get_int("llama.vocab_size") == 1024 and r.tensors["token_embd.weight"].shape == (576, 1024)
    g = gguf.GGUFReader(path)
    assert sum(t.n_bytes for t in g.tensors) == sum(t.nbytes for t in r.tensors.values())
    for name in ("blk.29.ffn_down.weight", "blk.0.attn_q.weight", "token_embd.weight"):
        x = _dequant(r.tensor_bytes(name), r.tensors[name].ggml_type)
        assert np.isfinite(x).all() and 0.015 < x.std() < 0.03, name


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path, tiny_file):
    a = tiny_file("tiny-qwen2", "q8_0", seed=1).read_bytes()
    assert synth("tiny-qwen2", "q8_0", tmp_path / "b.gguf", seed=1).read_bytes() == a
    c = GGUFReader(tiny_file("tiny-qwen2", "q8_0", seed=2))
    assert c.tensor_bytes("blk.1.ffn_up.weight").tobytes() != GGUFReader(tmp_path / "b.gguf").tensor_bytes(
        "blk.1.ffn_up.weight").tobytes()


def test_vocab_is_a_valid_byte_level_bpe():
    import tokenizers  # (the test extra installs it with transformers: missing is a failure, not a skip)
    from tokenizers import decoders, models, pre_tokenizers

    b2u = byte_to_unicode()
    assert set(b2u) == set(pre_tokenizers.ByteLevel.alphabet()) and b2u[32] == "Ġ" and b2u[10] == "Ċ"
    tokens, types, merges, ids = synth_vocab(2000, specials_first=True)
    assert len(tokens) == len(set(tokens)) == 2000 and len(merges) == 2000 - 259
    assert ids == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2} and types[:4] == [3, 3, 3, 1]
    rank = {t: i for i, t in enumerate(tokens)}
    for m in merges:
        left, right = m.split(" ")
        assert left in rank and right in rank and left + right in rank
    tok = tokenizers.Tokenizer(models.BPE(vocab=rank, merges=[tuple(m.split(" ")) for m in merges]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = "the quick brown fox, at the end; héllo\n"
    enc = tok.encode(text)
    assert tok.decode(enc.ids) == text
    assert len(enc.ids) < len(text.encode())  # the fixed merges ("Ġt", "th", "he", ...) apply
    last = synth_vocab(400, specials_first=False)[3]
    assert last == {"<|endoftext|>": 397, "<|im_start|>": 398, "<|im_end|>": 399}
    with pytest.raises(UnsupportedError, match="too small"):
        synth_vocab(100, True)


def test_spm_vocab_small_sizes_keep_the_first_characters(tmp_path):
    """`--vocab` below specials + 256 bytes + 95 characters keeps "▁" and the first characters;
    one below specials + 256 bytes is a typed error."""
    specials = ("<pad>", "<eos>", "<bos>")
    tokens, scores, types = spm_vocab(3 + 256 + 5, specials)
    assert tokens[:3] == list(specials) and tokens[3] == "<0x00>" and tokens[258] == "<0xFF>"
    assert tokens[259:] == ["\u2581", "!", '"', "#", "$"]
    assert len(scores) == len(types) == 264 and types[259:] == [1] * 5
    full = spm_vocab(3 + 256 + 95 + 40, specials)[0]
    assert len(full) == len(set(full)) == 394 and full[354] == "\u2581a"  # the first merge follows the characters
    assert full[259:354] == ["\u2581"] + [chr(c) for c in range(0x21, 0x7F)]
    with pytest.raises(UnsupportedError, match="too small for a SentencePiece"):
        spm_vocab(3 + 255, specials)
    r = GGUFReader(synth("tiny-gemma3", "f32", tmp_path / "g.gguf", vocab=300))
    assert len(r.metadata["tokenizer.ggml.tokens"]) == 300 and r.tensors["token_embd.weight"].shape == (256, 300)


def test_hf_transformers_loads_tiny_f32(tiny_file):
    import accelerate  # noqa: F401 (transformers needs it for gguf_file=; both are in the test extra)
    import torch
    import transformers

    for preset in ("tiny-llama", "tiny-qwen2"):
        p = PRESETS[preset]
        path = tiny_file(preset, "f32")
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name)
        cfg = model.config
        assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads,
                cfg.num_key_value_heads, cfg.vocab_size) == (2, 256, 512, 4, 2, 512)
        assert cfg.tie_word_embeddings == p.tied
        r = GGUFReader(path)
        emb = r.tensor_bytes("token_embd.weight").view(np.float32).reshape(512, 256)
        assert np.array_equal(model.get_input_embeddings().weight.detach().numpy(), emb)
        down = r.tensor_bytes("blk.1.ffn_down.weight").view(np.float32).reshape(256, 512)
        assert np.array_equal(model.model.layers[1].mlp.down_proj.weight.detach().numpy(), down)
        tok = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        ids = tok("the end")["input_ids"]
        vocab = r.metadata["tokenizer.ggml.tokens"]
        # hand-applied BPE: t-h ranks below h-e, Ġ-e below e-n and n-d; no "th e" or "Ġe nd" merge at 512
        assert [vocab[i] for i in ids] == ["th", "e", "Ġe", "nd"]
        logits = model(torch.tensor([ids])).logits
        assert logits.shape == (1, 4, 512) and torch.isfinite(logits).all()


def test_cli(tmp_path, capsys):
    out = tmp_path / "m.gguf"
    assert main(["synth", "tiny-llama", "q8_0", str(out), "--seed", "3", "--vocab", "300"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    r = GGUFReader(out)
    assert len(r.metadata["tokenizer.ggml.tokens"]) == 300 and "seed 3" in r.get_str("general.name")


def test_bad_requests_are_typed(tmp_path):
    with pytest.raises(UnsupportedError, match="unknown synth preset"):
        synth("gpt5", "q4_0", tmp_path / "x.gguf")
    with pytest.raises(UnsupportedError, match="unknown synth quant"):
        synth("tiny-llama", "q7_k", tmp_path / "x.gguf")
    with pytest.raises(UnsupportedError, match=r"logit_scale -2.0: .*smollm2-135m is not tiny"):
        synth("smollm2-135m", "q4_0", tmp_path / "x.gguf", logit_scale=-2.0)
    with pytest.raises(UnsupportedError, match="logit_scale 0"):
        synth("tiny-llama", "q4_0", tmp_path / "x.gguf", logit_scale=0)
    with pytest.raises(UnsupportedError, match="seed -1: a weight seed is an integer >= 0"):
        synth("tiny-llama", "q4_0", tmp_path / "x.gguf", seed=-1)
    with pytest.raises(UnsupportedError, match="vocab 10000000000 is too large"):  # was: a vocabulary built for ever
        synth("tiny-llama", "q4_0", tmp_path / "x.gguf", vocab=10**10)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags,message", [(["--seed", "-1"], "seed -1: a weight seed is an integer >= 0"),
                                           (["--vocab", "10000000000"], "vocab 10000000000 is too large")])
def test_cli_bad_seed_or_vocab_is_one_error_line(tmp_path, capsys, flags, message):
    assert main(["synth", "tiny-llama", "q4_0", str(tmp_path / "x.gguf"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert list(tmp_path.iterdir()) == []


def test_logit_scale_multiplies_the_logits_and_nothing_else(tmp_path):
    """`logit_scale` (what the decisive tiny models of the greedy tests use): the output norm's
    weights times the factor, every other tensor's bytes the same, so the logits times the factor."""
    import torch

    from minfer.api import load

    base = synth("tiny-qwen2", "q4_0", tmp_path / "a.gguf")
    assert main(["synth", "tiny-qwen2", "q4_0", str(tmp_path / "b.gguf"), "--logit-scale", "20"]) == 0
    ra, rb = GGUFReader(base), GGUFReader(tmp_path / "b.gguf")
    for name in ra.tensors:
        a, b = ra.tensor_bytes(name), rb.tensor_bytes(name)
        if name == "output_norm.weight":
            np.testing.assert_array_equal(b.view(np.float32), a.view(np.float32) * np.float32(20))
        else:
            assert a.tobytes() == b.tobytes(), name
    assert "logit scale 20" in rb.get_str("general.name")
    ids = [5, 9, 200, 31, 7]
    logits = []
    for path in (base, tmp_path / "b.gguf"):
        with load(path, n_ctx=16, n_slots=1, progress=False) as m:
            logits.append(m.logits(ids).double())
    assert torch.allclose(logits[1], 20 * logits[0], rtol=1e-5, atol=1e-5 * float(logits[1].abs().max()))
