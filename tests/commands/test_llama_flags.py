"""Flags as llama.cpp means them (issue 23, item 3): exact spellings only, llama.cpp's short
flags, an unknown flag under the subcommand's usage, -ngl said once, --chat-template names,
perplexity's -c (the chunk) and serve's -c (the total over -np; tests/server checks the split)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from minfer.cli import build_parser
from minfer.tokenizer.chat import render_chat
from minfer.tokenizer.templates import BUILTIN


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize("argv,field,want", [
    (["run", "-hf", "o/r:Q4_1", "x"], "hf_repo", "o/r:Q4_1"),
    (["run", "-hfr", "o/r", "x"], "hf_repo", "o/r"),
    (["run", "--hf-repo", "o/r", "x"], "hf_repo", "o/r"),
    (["run", "-hf", "o/r", "-hff", "f.gguf", "x"], "hf_file", "f.gguf"),
    (["run", "-hft", "tok", "x"], "hf_token", "tok"),
    (["run", "-mu", "https://h/x.gguf", "x"], "model_url", "https://h/x.gguf"),
    (["run", "-ngl", "99", "x"], "n_gpu_layers", 99),
    (["run", "--n-gpu-layers", "99", "x"], "n_gpu_layers", 99),
    (["serve", "-ngl", "0"], "n_gpu_layers", 0),
    (["run", "-cnv"], "conversation", True),
    (["run", "-no-cnv", "x"], "conversation", False),
    (["chat", "-sys", "be brief"], "system", "be brief"),
    (["chat", "--system-prompt", "be brief"], "system", "be brief"),
    (["chat", "--jinja"], "jinja", True),
    (["chat", "--chat-template", "llama3"], "chat_template", "llama3"),
    (["run", "-v", "x"], "verbose", True),
    (["serve", "--verbose"], "verbose", True),
    (["perplexity", "-c", "128", "f.txt"], "ctx", 128),
    (["serve", "-a", "my-model"], "alias", "my-model"),
    (["run", "-n", "5", "x"], "n_predict", 5),
    (["serve"], "prefix_cache", True),
    (["serve", "--no-prefix-cache"], "prefix_cache", False),
    (["serve", "--no-enable-prefix-caching"], "prefix_cache", False),  # vLLM's spelling
    (["batch", "--prefix-block", "16", "in.jsonl", "out.jsonl"], "prefix_block", 16),
    (["serve", "--spec", "ngram"], "spec", "ngram"),
    (["run", "--draft", "5", "x"], "draft_max", 5),  # llama.cpp's spellings of --draft-max
    (["run", "--draft-n", "6", "x"], "draft_max", 6),
    (["serve", "-md", "small.gguf"], "model_draft", "small.gguf"),  # llama.cpp's --model-draft
])
def test_llama_cpp_spellings_parse_to_what_they_mean(argv, field, want):
    assert getattr(parse(*argv), field) == want


@pytest.mark.parametrize("argv", [["run", "--te", "0.5", "x"], ["run", "--n-pred", "3", "x"], ["serve", "--po", "1"]])
def test_no_abbreviations(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err


def test_unknown_flag_is_reported_under_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as e:
        parse("run", "--no-such-flag", "x")
    err = capsys.readouterr().err
    assert e.value.code == 2 and "usage: minfer run" in err and "minfer run: error: unrecognized arguments: " \
        "--no-such-flag" in err


@pytest.mark.parametrize("command", ["run", "chat", "serve", "pull", "list"])
def test_version_everywhere(command):
    proc = subprocess.run([sys.executable, "-m", "minfer", command, "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "minfer 0.1.0"


def test_seed_minus_one_is_a_random_seed_as_in_llama_cpp(run_cli, tiny_gguf):
    """llama.cpp's `-s -1` (its default, "use random seed for -1") is a random seed here too, not an
    error; below -1 is still one error naming the flag."""
    from minfer.commands.common import sampling

    assert sampling(parse("run", "-s", "-1", "x")).seed is None
    assert sampling(parse("serve", "--seed", "-1")).seed is None
    assert sampling(parse("run", "-s", "7", "x")).seed == 7
    rc, out, err = run_cli(["run", "-m", str(tiny_gguf()), "-s", "-1", "-n", "3", "hi"])
    assert rc == 0 and "generated: 3" in err, err
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-s", "-2", "-n", "3", "hi"])
    assert rc == 2 and "-s/--seed must be >= 0" in err, err


def test_ngl_is_said_once(run_cli, tiny_gguf):
    rc, _, err = run_cli(["run", "-m", str(tiny_gguf()), "-ngl", "99", "-n", "2", "--temp", "0", "hi"])
    assert rc == 0 and err.count("-ngl 99: minfer runs every layer on --device cpu") == 1


def test_perplexity_c_is_the_chunk(run_cli, tiny_gguf, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    rc, out_c, _ = run_cli(["perplexity", "-m", str(tiny_gguf()), "-c", "64", str(text)])
    rc2, out_chunk, _ = run_cli(["perplexity", "-m", str(tiny_gguf()), "--chunk", "64", str(text)])
    assert rc == rc2 == 0 and "chunks of 64" in out_c
    assert out_c.split("(")[0] == out_chunk.split("(")[0]  # the same PPL line (timings apart)
    rc, _, err = run_cli(["perplexity", "-m", str(tiny_gguf()), "-c", "63", str(text)])
    assert rc == 2 and "-c/--ctx-size (the chunk size) must be an even number" in err


CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
EXPECTED = {  # llama.cpp's built-in formatters (src/llama-chat.cpp) on CONVERSATION, generation prompt on
    "chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
              "Hello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
    "llama3": "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user"
              "<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
              "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|><|start_header_id|>assistant"
              "<|end_header_id|>\n\n",
    "gemma": "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
             "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "phi3": "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello.<|end|>\n<|user|>\nBye<|end|>\n"
            "<|assistant|>\n",
    "zephyr": "<|system|>\nBe brief.<|endoftext|>\n<|user|>\nHi<|endoftext|>\n<|assistant|>\nHello.<|endoftext|>\n"
              "<|user|>\nBye<|endoftext|>\n<|assistant|>\n",
    "mistral": "[SYSTEM_PROMPT] Be brief.[/SYSTEM_PROMPT][INST] Hi[/INST] Hello.</s>[INST] Bye[/INST]",
    "vicuna": "Be brief.\n\nUSER: Hi\nASSISTANT: Hello.</s>\nUSER: Bye\nASSISTANT:",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_chat_templates_write_llama_cpps_text(name):
    assert render_chat(BUILTIN[name], CONVERSATION) == EXPECTED[name]


def test_chat_template_by_name_reaches_the_model(run_cli, tiny_gguf, rendered_prompts, tmp_path):
    seen = rendered_prompts
    rc, _, _ = run_cli(["chat", "-m", str(tiny_gguf()), "-n", "2", "--temp", "0", "--chat-template", "phi3",
                        "-sys", "Be brief."], stdin="Hi\n")
    assert rc == 0 and seen == ["<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\n"]
    rc, _, err = run_cli(["chat", "-m", str(tmp_path / "never-read.gguf"), "--chat-template", "nosuch"], stdin="")
    assert rc == 2 and "not a built-in template (chatml, llama3" in err and "never-read" not in err


def test_run_cnv_is_a_chat_with_the_prompt_first(run_cli, tiny_gguf):
    """`run -cnv PROMPT`: the prompt is the first message, then stdin's lines (llama-cli's -cnv)."""
    from .conftest import chat_reference

    rc, out, _ = run_cli(["run", "-cnv", "-m", str(tiny_gguf()), "-n", "3", "--temp", "0", "hello"],
                         stdin="the cat\n")
    first, second = chat_reference(tiny_gguf(), ["hello", "the cat"], 3)
    assert rc == 0 and out == first + "\n" + second + "\n"


def test_kv_cache_help_names_what_each_backend_takes(capsys):
    """--kv-cache's help lists each backend's KV types (it said "f32, f16" for every backend: f16 is
    cuda's only, and cuda's q8_0 was not named)."""
    from minfer.backends.cpu.backend import KV_SUPPORTED as CPU
    from minfer.backends.cuda.backend import KV_SUPPORTED as CUDA
    from minfer.backends.vulkan.backend import KV_SUPPORTED as VULKAN

    with pytest.raises(SystemExit):
        parse("run", "--help")
    text = " ".join(capsys.readouterr().out.split())
    start = text.index("--kv-cache TYPE KV cache type:")
    help_text = text[start:text.index("--tp N", start)]
    for backend, kinds in (("cpu", CPU), ("vulkan", VULKAN), ("cuda", CUDA)):
        for kind in kinds:
            assert kind in help_text and backend in help_text, (backend, kind, help_text)
    assert "f32 (cpu, vulkan)" in help_text and "f16 or q8_0 (cuda)" in help_text, help_text
