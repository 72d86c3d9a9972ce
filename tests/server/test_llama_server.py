"""The server as people deploy it (issue 23, item 5): any model name, --alias, a ready line and
an access log, server-wide sampling defaults and --chat-template, llama-server's /tokenize,
/detokenize, /props and /slots, echo and suffix (fill in the middle) on /v1/completions, and
`-c` as the total context over `-np` slots."""

from __future__ import annotations

import re

import httpx
import pytest

from .conftest import N_CTX, N_SLOTS, start_server, stop_server

FIM = {"tokenizer.ggml.fim_pre_token_id": 5, "tokenizer.ggml.fim_suf_token_id": 6,
       "tokenizer.ggml.fim_mid_token_id": 7}


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, tiny_gguf, rewrite_gguf):
    """A tiny model with fill-in-the-middle tokens, served with an alias, greedy 3-token defaults,
    the phi3 template and -v."""
    from minfer.gguf.writer import ValueType

    tmp = tmp_path_factory.mktemp("tiny-serve")
    model = rewrite_gguf(tiny_gguf("tiny-llama", "q4_1"), tmp / "fim.gguf",
                         meta={k: (ValueType.UINT32, v) for k, v in FIM.items()})
    s = start_server(tmp, "--alias", "house-model", "--temp", "0", "-n", "3", "--chat-template", "phi3", "-v",
                     "-np", "2", "-c", "256", model=model)
    yield s
    stop_server(s)


def test_any_model_name_is_the_one_served(server, model_id):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    for name in ("gpt-4o", model_id, "whatever/else"):
        r = httpx.post(server.url + "/v1/chat/completions", json={**body, "model": name}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == model_id, r.text
    assert httpx.get(server.url + "/v1/models/gpt-4o").json()["id"] == model_id


def test_c_is_the_total_context_over_the_slots(server):
    """The session's server runs `-np 8 -c 4096`: 8 slots of 512 tokens, as llama-server."""
    props = httpx.get(server.url + "/props").json()
    assert props["total_slots"] == N_SLOTS and props["default_generation_settings"]["n_ctx"] == N_CTX
    slots = httpx.get(server.url + "/slots").json()
    assert [s["id"] for s in slots] == list(range(N_SLOTS)) and {s["n_ctx"] for s in slots} == {N_CTX}
    assert all(s["is_processing"] is False for s in slots)  # nothing runs between the tests


def test_props_show_the_defaults(server):
    props = httpx.get(server.url + "/props").json()
    params = props["default_generation_settings"]["params"]
    assert params["temperature"] == 0.8 and params["top_k"] == 40 and params["n_predict"] == -1  # llama.cpp's
    assert props["model_path"].endswith(".gguf") and "<|im_start|>" in props["chat_template"]


def test_tokenize_detokenize_round_trip(server):
    text = "The capital of France is Paris."
    toks = httpx.post(server.url + "/tokenize", json={"content": text}).json()["tokens"]
    assert toks and all(isinstance(t, int) for t in toks)
    assert httpx.post(server.url + "/detokenize", json={"tokens": toks}).json() == {"content": text}
    pieces = httpx.post(server.url + "/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == toks and "".join(p["piece"] for p in pieces) == text
    special = httpx.post(server.url + "/tokenize", json={"content": "<|im_start|>", "parse_special": True}).json()
    assert len(special["tokens"]) == 1  # one control token, parsed


def test_echo_puts_the_prompt_first(server, client, model_id):
    prompt = "The capital of France is"
    whole = client.completions.create(model=model_id, prompt=prompt, max_tokens=4, temperature=0, echo=True)
    plain = client.completions.create(model=model_id, prompt=prompt, max_tokens=4, temperature=0)
    assert whole.choices[0].text == prompt + plain.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model_id, prompt=prompt, max_tokens=4, temperature=0, echo=True, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def test_alias_ready_line_access_log_and_defaults(tiny_server):
    s = tiny_server
    assert httpx.get(s.url + "/v1/models").json()["data"][0]["id"] == "house-model"
    body = {"prompt": "hello there", "model": "anything"}
    a = httpx.post(s.url + "/v1/completions", json=body, timeout=60).json()
    b = httpx.post(s.url + "/v1/completions", json={**body, "temperature": 0, "max_tokens": 3}, timeout=60).json()
    assert a["usage"]["completion_tokens"] == 3 and a["choices"][0]["text"] == b["choices"][0]["text"]  # -n 3, greedy
    assert a["model"] == "house-model"
    props = httpx.get(s.url + "/props").json()
    assert props["default_generation_settings"]["params"]["temperature"] == 0
    assert props["default_generation_settings"]["params"]["n_predict"] == 3
    assert props["chat_template"].startswith("{% for m in messages %}{{ '<|'")  # the phi3 built-in
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 128  # -c 256 over -np 2
    log = s.log.read_text()
    assert re.search(rf"minfer: ready: {re.escape(s.url)} \(chat page at /", log), log
    assert '"POST /v1/completions HTTP/1.1" 200' in log  # uvicorn's access log
    assert re.search(r"DEBUG: +/v1/completions: \d+ prompt tokens, SamplingParams\(max_tokens=3", log), log  # -v


def test_suffix_fills_in_the_middle(tiny_server, tiny_gguf):
    """`suffix`: the prompt is llama.cpp's infill prompt, [BOS] PRE prefix SUF suffix MID."""
    from minfer.api import Prompting
    from minfer.tokenizer import Tokenizer

    s = tiny_server
    r = httpx.post(s.url + "/v1/completions", json={"prompt": "def f(", "suffix": "return x", "max_tokens": 3,
                                                     "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    tok = Tokenizer.from_gguf(tiny_gguf("tiny-llama", "q4_1"))
    front = Prompting()
    front.tokenizer = tok
    with pytest.raises(Exception, match="no fill-in-the-middle tokens"):
        front.infill_ids("a", "b")  # the original file has none
    pre = tok.encode("def f(", add_special=False)
    suf = tok.encode("return x", add_special=False)
    bos = [tok.bos_id] if tok.add_bos else []
    assert r.json()["usage"]["prompt_tokens"] == len(bos + [5, *pre, 6, *suf, 7])
    ids = httpx.post(s.url + "/tokenize", json={"content": "def f("}).json()["tokens"]
    assert ids == pre


def test_chat_page_takes_the_servers_defaults(chromium, tiny_server):
    page = chromium.new_page()
    try:
        page.goto(tiny_server.url + "/")
        page.wait_for_selector("body[data-defaults='1']", timeout=15_000)
        assert page.input_value("#temperature") == "0" and page.input_value("#max-tokens") == "3"
        assert page.text_content("#model") == "house-model"
    finally:
        page.close()
