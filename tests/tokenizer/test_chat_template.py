"""Chat template rendering: the SmolLM2 template, the ChatML fallback, HF conventions, limits."""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from minfer.errors import TemplateError
from minfer.gguf.reader import GGUFReader
from minfer.tokenizer import Tokenizer, render_chat
from minfer.tokenizer.chat import MAX_SIZE, ChatTemplate


@pytest.fixture(scope="module")
def smollm2_template(smollm2_path) -> str:
    with GGUFReader(smollm2_path) as r:
        return r.metadata["tokenizer.chat_template"]


def test_smollm2_template_two_messages(smollm2_template):
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"}]
    assert render_chat(smollm2_template, msgs) == (
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_template_adds_its_default_system_prompt(smollm2_template):
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert render_chat(smollm2_template, msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n"
    )


def test_rendered_prompt_tokenizes_like_llamacpp(smollm2_path, llamacpp_ref):
    tok = Tokenizer.from_gguf(smollm2_path)
    prompt = tok.apply_chat_template([{"role": "system", "content": "x"}, {"role": "user", "content": "What is 2+2?"}])
    ids = tok.encode(prompt, parse_special=True)
    case = next(c for c in llamacpp_ref["tokenize"] if c["text"].startswith("<|im_start|>user\nWhat is 2+2?"))
    assert ids[-len(case["ids"]):] == case["ids"]


@pytest.mark.parametrize("template", [None, "", "   "])
def test_chatml_fallback(template):
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert render_chat(template, msgs) == (
        "<|im_start|>user\na<|im_end|>\n<|im_start|>assistant\nb<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(template, msgs, add_generation_prompt=False).endswith("b<|im_end|>\n")


def test_hf_conventions():
    msgs = [{"role": "user", "content": "  hi  "}]
    assert render_chat("{{ bos_token }}{{ messages[0].content|trim }}{{ eos_token }}", msgs,
                       bos_token="<s>", eos_token="</s>") == "<s>hi</s>"
    assert render_chat("{{ tools is none }}", msgs) == "True"
    assert render_chat("{{ tools|tojson }}", msgs, tools=[{"name": "f", "q": "é"}]) == '[{"name": "f", "q": "é"}]'
    assert render_chat("{{ {'a': [1]}|tojson(indent=2) }}", msgs) == '{\n  "a": [\n    1\n  ]\n}'
    assert render_chat("{{ strftime_now('%Y') }}", msgs) == str(datetime.now().year)
    assert render_chat("{% if enable_thinking %}T{% endif %}", msgs, enable_thinking=True) == "T"
    # trim_blocks + lstrip_blocks, namespace, loop controls
    template = (
        "{% set ns = namespace(n=0) %}\n"
        "{% for m in messages %}\n"
        "  {% if m.role == 'system' %}{% continue %}{% endif %}\n"
        "  {% set ns.n = ns.n + 1 %}\n"
        "[{{ ns.n }}:{{ m.role }}]\n"
        "  {% if loop.index >= 3 %}{% break %}{% endif %}\n"
        "{% endfor %}"
    )
    convo = [{"role": r, "content": ""} for r in ("system", "user", "assistant", "user", "assistant")]
    assert render_chat(template, convo) == "[1:user]\n[2:assistant]\n"


def test_raise_exception_is_a_template_error():
    template = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok"
    assert render_chat(template, [{"role": "user", "content": ""}]) == "ok"
    with pytest.raises(TemplateError, match="first must be user"):
        render_chat(template, [{"role": "assistant", "content": ""}])


def test_bad_arguments():
    with pytest.raises(TemplateError, match="list of dicts"):
        render_chat(None, "hello")  # type: ignore[arg-type]
    with pytest.raises(TemplateError, match="list of dicts"):
        render_chat(None, [["user", "hi"]])  # type: ignore[list-item]
    with pytest.raises(TemplateError, match="must be a string"):
        render_chat(42, [])  # type: ignore[arg-type]
    with pytest.raises(TemplateError, match="failed"):
        render_chat(None, [{"role": "user", "content": None}])  # str + None inside the template


def test_long_conversation_renders_quickly(smollm2_template):
    msgs = [{"role": ("user", "assistant")[i % 2], "content": f"message {i} " * 20} for i in range(2000)]
    out = render_chat(smollm2_template, msgs)  # inside the render deadline (2 s), or a TemplateError
    assert out.count("<|im_start|>") == 2002  # default system + 2000 + generation prompt


def test_output_limit():
    with pytest.raises(TemplateError, match="output exceeds"):
        render_chat("{% for m in messages %}{{ m.content }}{% endfor %}",
                    [{"role": "user", "content": "x" * 600_000}] * 2)
    just_under = MAX_SIZE - 100
    assert len(render_chat("{{ messages[0].content }}", [{"role": "u", "content": "x" * just_under}])) == just_under


def test_deadline_stops_slow_templates():
    # 90 000 iterations (under the loop cap), each building a 100 kB string: only the clock stops it
    slow = ChatTemplate("{% for i in range(10000) %}{% for j in range(9) %}{{ ('x' * 100000)|length }}"
                        "{% endfor %}{% endfor %}", time_limit=0.05)
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match="time limit"):
        slow.render([])
    assert time.perf_counter() - t0 < 10.0  # stopped by the 0.05 s limit, not by finishing (~2 s of work)


# exercises what real HF templates use; a guarded render must equal a plain sandboxed one
FEATURES_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}{% set date_string = "26 Jul 2024" %}{% endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system = "" %}
{%- endif %}
{{- "<|sys|>Today: " ~ date_string ~ "\\n" }}
{%- if tools is not none %}
    {%- for t in tools %}{{ t|tojson(indent=4) }}{{ "\\n" if not loop.last }}{% endfor %}
    {{- "\\nnames: " + (tools|map(attribute='name')|join(', ')) }}
{%- endif %}
{{- system }}
{%- set ns = namespace(users=0, last='') %}
{%- for message in messages %}
    {%- if 'tool_calls' in message %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|call|>{"name": "%s", "arguments": %s}' % (call.name, call.arguments|tojson) }}
    {%- elif message.role == 'tool' %}
        {{- '<|tool|>' + (message.content|tojson if message.content is mapping else message.content) }}
    {%- else %}
        {%- if message.role == 'user' %}{% set ns.users = ns.users + 1 %}{% endif %}
        {{- '<|{}|>{}'.format(message.role, message.content|replace('\\t', ' ')) }}
        {%- set ns.last = message.role|upper %}
    {%- endif %}
    {%- if loop.index0 > 50 %}{{ raise_exception('too long') }}{% endif %}
{%- endfor %}
{{- "|users=%d last=%s|" % (ns.users, ns.last) }}
{%- for k, v in {'a': 1, 'b': [1, 2]}|dictsort %}{{ k }}={{ v|default('-') }};{% endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"""


def test_guarded_render_equals_plain_jinja_sandbox():
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    from minfer.tokenizer.chat import _tojson

    msgs = [
        {"role": "system", "content": "  Be brief.  "},
        {"role": "user", "content": "weather\tin Paris?"},
        {"role": "assistant", "tool_calls": [{"function": {"name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": {"temp_c": 21}},
        {"role": "user", "content": "thanks"},
    ]
    tools = [{"name": "weather", "parameters": {"city": "string"}}, {"name": "time", "parameters": {}}]
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    plain.filters["tojson"] = _tojson
    expected = plain.from_string(FEATURES_TEMPLATE).render(
        messages=msgs, tools=tools, add_generation_prompt=True, bos_token="<s>", eos_token="</s>")
    assert "|users=2 last=USER|" in expected and '"city": "Paris"' in expected
    assert render_chat(FEATURES_TEMPLATE, msgs, tools=tools, bos_token="<s>", eos_token="</s>") == expected
