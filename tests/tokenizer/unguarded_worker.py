"""A render worker child with no guards (plain jinja2), for tests/tokenizer/test_render_worker.py:
what the kernel's limits hold when the sandbox's own checks miss something. Not collected."""

from __future__ import annotations

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from minfer.errors import TemplateError
from minfer.tokenizer.render_worker import serve


def render_unguarded(template, messages, add_generation_prompt=True, bos_token="", eos_token="", **extra):
    env = ImmutableSandboxedEnvironment()
    try:
        return env.from_string(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                bos_token=bos_token, eos_token=eos_token, **extra)
    except MemoryError:
        raise
    except jinja2.TemplateError as e:
        raise TemplateError(str(e)) from None


def main() -> None:
    serve(render_unguarded)
