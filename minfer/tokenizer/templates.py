"""Built-in chat templates by name, as llama.cpp's `--chat-template NAME` knows them.

Each is Jinja that writes the same text as llama.cpp's built-in formatter of that name
(src/llama-chat.cpp): the turn markers, where the system prompt goes, and the assistant's
opening when a generation prompt is asked for. BOS is the tokenizer's (add_special), so no
template writes it. `--chat-template` takes one of these names or a Jinja file.
"""

from __future__ import annotations

from collections.abc import Mapping

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Gemma 3's own template (text parts): a system message becomes the first user turn's prefix, the
# assistant is "model", and roles must alternate user / assistant after it: anything else (a
# second system message, a "tool" turn, two user turns in a row) raises, a TemplateError here.
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


def builtin_template(tokens: Mapping[str, int]) -> str | None:
    """The template of a model family recognised by its vocabulary (`tokens`: text -> id), for
    files that carry none: Gemma's turn markers -> GEMMA_TEMPLATE; None otherwise (ChatML)."""
    if "<start_of_turn>" in tokens and "<end_of_turn>" in tokens:
        return GEMMA_TEMPLATE
    return None


_LLAMA3 = (
    "{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# gemma: no system role; the system text opens the next user turn, "assistant" is "model"
_GEMMA = (
    "{% set ns = namespace(sys='') %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns.sys = ns.sys + m['content'] | trim %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) + '\\n' }}"
    "{% if m['role'] != 'assistant' and ns.sys %}{{ ns.sys + '\\n\\n' }}{% set ns.sys = '' %}{% endif %}"
    "{{ m['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)

_PHI3 = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_ZEPHYR = (
    "{% for m in messages %}"
    "{{ '<|' + m['role'] + '|>\\n' + m['content'] + '<|endoftext|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

# mistral-v7 (llama.cpp's "mistral-v7"; "mistral" here means it)
_MISTRAL = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ '[SYSTEM_PROMPT] ' + m['content'] + '[/SYSTEM_PROMPT]' }}"
    "{% elif m['role'] == 'user' %}{{ '[INST] ' + m['content'] + '[/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + '</s>' }}{% endif %}"
    "{% endfor %}"
)

# vicuna (llama.cpp's "vicuna"): the system text as a plain first paragraph
_VICUNA = (
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}"
    "{% elif m['role'] == 'user' %}{{ 'USER: ' + m['content'] + '\\n' }}"
    "{% else %}{{ 'ASSISTANT: ' + m['content'] + '</s>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

BUILTIN = {
    "chatml": CHATML_TEMPLATE,
    "llama3": _LLAMA3,
    "gemma": _GEMMA,
    "phi3": _PHI3,
    "zephyr": _ZEPHYR,
    "mistral": _MISTRAL,
    "mistral-v7": _MISTRAL,
    "vicuna": _VICUNA,
}
