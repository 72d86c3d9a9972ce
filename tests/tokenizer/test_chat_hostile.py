"""Hostile chat templates: every payload must end in TemplateError, quickly, having run nothing."""

from __future__ import annotations

import time

import pytest

from minfer.errors import TemplateError
from minfer.tokenizer import render_chat

MSGS = [{"role": "user", "content": "hi"}]


# name -> template; CMD stands for a shell command that would create a marker file
CMD = "touch MARKER"
HOSTILE = {
    # SSTI walks to code execution
    "class_mro_subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "base_subclasses_popen": "{% for c in [].__class__.__base__.__subclasses__() %}"
                             f"{{% if c.__name__ == 'Popen' %}}{{{{ c('{CMD}', shell=True) }}}}{{% endif %}}"
                             "{% endfor %}",
    "cycler_globals_os": f"{{{{ cycler.__init__.__globals__.os.system('{CMD}') }}}}",
    "joiner_globals_os": f"{{{{ joiner.__init__.__globals__['os'].popen('{CMD}').read() }}}}",
    "namespace_globals": f"{{{{ namespace.__init__.__globals__.os.system('{CMD}') }}}}",
    "builtin_globals": "{{ raise_exception.__globals__['__builtins__']['eval']('1') }}",
    "self_context": "{{ self._TemplateReference__context }}",
    "getitem_dunder": "{{ ''['__class__']['__mro__'] }}",
    "attr_filter": "{{ ''|attr('__class__')|attr('__mro__') }}",
    "map_attribute": "{{ ['']|map(attribute='__class__')|list }}",
    "format_attr": "{{ '{0.__class__.__mro__}'.format('') }}",
    "format_map_attr": "{{ '{a.__class__}'.format_map({'a': 1}) }}",
    "type_mro": "{{ dict.mro()[-1].__subclasses__() }}",
    "os_module": f"{{{{ os.system('{CMD}') }}}}",
    "import_name": "{{ __import__('os').system('id') }}",
    "mutate_messages": "{{ messages.append({'role': 'x'}) }}{{ messages.pop() }}",
    "include_file": "{% include '/etc/passwd' %}",
    # resource exhaustion
    "huge_range": "{% for i in range(10**9) %}{% endfor %}",
    "range_over_cap": "{{ range(1000000)|list|length }}",
    "nested_loops": "{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}",
    "nested_string_loops": "{% set s = 'ab' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "string_multiplication": "{{ 'a' * 10**9 }}",
    "list_multiplication": "{{ ([1] * 1000000) * 1000000 }}",
    "doubling_concat": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}{{ ns.s|length }}",
    "big_power": "{{ 10 ** 10000000 }}",
    "format_width": "{{ '{:>999999999}'.format(1) }}",
    "format_nested_width": "{{ '{:{}}'.format('a', 999999999) }}",
    "printf_width": "{{ '%999999999d' % 1 }}",
    "printf_star": "{{ '%*d' % (999999999, 1) }}",
    "format_filter": "{{ '%0999999999d'|format(1) }}",
    "center_filter": "{{ 'a'|center(1000000000) }}",
    "indent_filter": "{% set s = '\n' * 500000 %}{{ s|indent(500000) }}",
    "join_bomb": "{% set s = 'a' * 1000000 %}{{ range(10000)|join(s) }}",
    "str_join_bomb": "{% set s = 'a' * 1000000 %}{{ s.join(['x'] * 10000) }}",
    "replace_bomb": "{% set s = 'a' * 100000 %}{{ s|replace('', s) }}",
    "expandtabs_bomb": "{{ ('\t' * 100000).expandtabs(1000000) }}",
    "ljust_bomb": "{{ 'a'.ljust(10**10) }}",
    "to_bytes_bomb": "{{ (1).to_bytes(10**10, 'big') }}",
    "slice_bomb": "{{ [1]|slice(100000000)|list }}",
    "tojson_indent": "{{ messages|tojson(indent=100000) }}",
    "lipsum": "{{ lipsum(10**8) }}",
    "output_flood": "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}",
    "concat_chain": "{% set s = 'a' * 1000000 %}{{ " + " ~ ".join(["s"] * 500) + " }}",
    "literal_list": "{% set s = 'a' * 1000000 %}{{ [" + ", ".join(["s"] * 500) + "] }}",
    "nested_literal": "{% set s = 'a' * 1000000 %}{% set l = [s] %}{{ [" + ", ".join(["l"] * 500) + "]|string }}",
    "set_block": "{% set s = 'a' * 1000000 %}{% set x %}{% for i in range(5000) %}{{ s }}{% endfor %}{% endset %}",
    "macro_body": "{% set s = 'a' * 1000000 %}{% macro m() %}{% for i in range(5000) %}{{ s }}{% endfor %}"
                  "{% endmacro %}{{ m()|length }}",
    "namespace_growth": "{% set s = 'a' * 1000000 %}{% set ns = namespace() %}"
                        + "".join(f"{{% set ns.a{i} = s %}}" for i in range(300)) + "{{ ns }}",
    "namespace_cycle": "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns|string }}",
    # recursion
    "macro_recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive_loop": "{% for x in [1] recursive %}{{ loop([1, 2]) }}{% endfor %}",
    "deep_parentheses": "{{ " + "(" * 3000 + "1" + ")" * 3000 + " }}",
    # plain failures
    "raise_exception": "{{ raise_exception('refused') }}",
    "syntax_error": "{% for %}{% endif %}",
    "oversized_source": "{# " + "x" * (65 * 1024) + " #}",
}



def test_corpus_size():
    assert len(HOSTILE) >= 20


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_refused(name, tmp_path):
    marker = tmp_path / "pwned"
    source = HOSTILE[name].replace("MARKER", str(marker))
    t0 = time.perf_counter()
    with pytest.raises(TemplateError):
        render_chat(source, MSGS)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, f"{name} took {elapsed:.2f}s"
    assert not marker.exists(), "the template executed a shell command"
