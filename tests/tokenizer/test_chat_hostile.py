"""Hostile chat templates: each payload ends in a TemplateError for its own reason, having run nothing
and allocated little."""

from __future__ import annotations

import re
import time
from pathlib import Path

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
    "mutate_messages": "{{ messages.append({'role': 'x'}) }}{{ messages.pop() }}",
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
    # limits of the source
    "oversized_source": "{# " + "x" * (65 * 1024) + " #}",
    # the rest of the class: every filter, method and operator that can grow its input
    "tojson_separators": "{{ messages|tojson(separators=('a' * 100000, 'b')) }}",
    "tojson_separators_items": "{% set l = [1] * 50000 %}{{ l|tojson(separators=('x' * 60, ':')) }}",
    "tojson_indent_nested": "{{ ([[1] * 1000] * 100)|tojson(indent=64) }}",
    "tojson_escapes": "{{ ('\"' * 1000000)|tojson }}",
    "translate_bomb": "{% set t = {97: 'x' * 100000} %}{{ ('a' * 10000).translate(t) }}",
    "maketrans_bomb": "{{ ('a' * 10000).translate(''.maketrans({'a': 'b' * 1000})) }}",
    "join_attribute_bomb": "{% set s = 'a' * 1000000 %}{{ ([{'a': 'x'}] * 10000)|join(s, attribute='a') }}",
    "join_mapped": "{{ range(10000)|map('string')|join('x' * 1000) }}",
    "zfill_bomb": "{{ '1'.zfill(10**9) }}",
    "center_method": "{{ 'a'.center(10**9) }}",
    "rjust_over_cap": "{{ 'a'.rjust(2000000) }}",
    "rjust_then_concat": "{% set a = 'a'.rjust(1000000) %}{{ a ~ a }}",
    "wordwrap_bomb": "{{ ('a ' * 100000)|wordwrap(1, wrapstring='x' * 1000) }}",
    "indent_first_blank": "{% set s = '\\n' * 500000 %}{{ s|indent(4, first=True, blank=True) }}",
    "batch_count": "{{ [1]|batch(1000000, fill_with='x')|list }}",
    "slice_count": "{{ [1]|slice(50000)|list }}",
    "printf_dict_width": "{{ '%(a)999999999s' % {'a': 1} }}",
    "format_map_width": "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
    "format_kwarg_width": "{{ '{:{w}}'.format('a', w=999999999) }}",
    "format_index_width": "{{ '{0[0]:>999999999}'.format([1]) }}",
    "list_add_doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}{% set ns.l = ns.l + ns.l %}"
                         "{% endfor %}{{ ns.l|length }}",
    "str_add_doubling": "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                        "{% endfor %}{{ ns.s|length }}",
    "dict_fromkeys": "{{ dict.fromkeys(range(10000), 'a' * 1000) }}",
    "loop_output": "{% for i in range(10000) %}{{ 'y' * 200 }}{% endfor %}",
    "encode_growth": "{% set s = '\\U0001F600' * 300000 %}{{ s.encode('utf-8')|length }}",
    "urlize_growth": "{{ ('www.a.io ' * 110000)|urlize }}",
    "power_digits": "{{ (10 ** 60000)|string }}",
    "product_chain": "{% set a = 10 ** 4000 %}{{ " + " * ".join(["a"] * 20) + " }}",
    "bytes_repetition": "{{ 'a'.encode() * 10**9 }}",
    "nested_list_repetition": "{{ [[1] * 100000] * 100000 }}",
    "deep_list_literal": "{{ " + "[" * 3000 + "]" * 3000 + " }}",
    "replace_growth": "{% set s = 'ab' * 300000 %}{{ s.replace('a', 'a' * 10) }}",
    "dict_update": "{% set d = {} %}{{ d.update({'a': 1}) }}",
    "dunder_len": "{{ messages.__len__() }}",
    "tuple_base": "{{ ().__class__.__base__ }}",
    "self_dict": "{{ self.__dict__ }}",
    "namespace_subclasses": "{{ namespace.__class__.__subclasses__() }}",
    "lipsum": "{{ lipsum(5) }}",
    "filter_chain": "{{ 1" + "|string" * 5000 + " }}",
    # str.format / % by all their fields together (a held-out template's 10^10-character format:
    # every width under the limit, 10,000 of them)
    "format_many_fields": "{{ ('{:>1000000}' * 10000).format(*range(10000)) }}",
    "format_same_arg_many_times": "{% set s = 'a' * 100000 %}{{ ('{0}' * 1000).format(s) }}",
    "format_named_many_times": "{% set s = 'a' * 100000 %}{{ ('{x}' * 1000).format(x=s) }}",
    "format_map_many_times": "{% set s = 'a' * 100000 %}{{ ('{x}' * 1000).format_map({'x': s}) }}",
    "format_precision_many": "{{ ('{:.900000f}' * 100).format(*([1.5] * 100)) }}",
    "format_attr_many": "{{ ('{0[0]}' * 1000).format(['a' * 100000]) }}",
    "format_nested_widths_many": "{{ ('{:{}}' * 500).format(*(['a', 900000] * 500)) }}",
    "printf_many_fields": "{{ ('%1000000s' * 100) % (" + ", ".join(map(str, range(100))) + ") }}",
    "printf_dict_many": "{% set s = 'a' * 100000 %}{{ ('%(a)s' * 1000) % {'a': s} }}",
    "printf_precision_many": "{{ ('%.900000f' * 100) % (" + ", ".join(["1.5"] * 100) + ") }}",
    "format_filter_many": "{{ ('%1000000d' * 100)|format(*range(100)) }}",
    # a lazy filter's items accumulated (a held-out map('center', N) over a list grew to 2.7 GB)
    "map_center_list": "{{ range(3000)|map('string')|map('center', 1000000)|list|length }}",
    "map_center_join": "{{ range(3000)|map('string')|map('center', 1000000)|join }}",
    "map_indent_list": "{{ range(300)|map('string')|map('replace', '', '\\n' * 500)|map('indent', 1000)|list|length }}",
    "map_format_list": "{{ (['%1000000d'] * 3000)|map('format', 1)|list|length }}",
    "map_replace_list": "{{ range(3000)|map('string')|map('replace', '', 'a' * 500)|list|length }}",
    "map_tojson_list": "{% set l = [1] * 20000 %}"
                       "{{ range(300)|map('string')|map('replace', '1', l|tojson)|list|length }}",
    "map_string_of_lists": "{% set l = range(9000)|list %}"
                           "{{ range(300)|map('string')|map('replace', '1', l|string)|list|length }}",
    "map_join_list": "{{ range(3000)|map('string')|map('center', 900)|map('join', 'y' * 9)|list|length }}",
    "select_then_list": "{{ range(3000)|map('string')|map('center', 100000)|select|list|length }}",
    "reject_then_list": "{{ range(3000)|map('string')|map('center', 100000)|reject('none')|list|length }}",
    "unique_then_list": "{{ range(3000)|map('string')|map('center', 100000)|unique|list|length }}",
    "batch_then_list": "{{ range(3000)|map('string')|map('center', 100000)|batch(3)|list|length }}",
    "map_chain_sum": "{{ range(3000)|map('string')|map('center', 100000)|sum(start='') }}",
    "map_then_tojson": "{{ range(3000)|map('string')|map('center', 100000)|list|tojson }}",
    "map_in_loop_collect": "{% set ns = namespace(l=[]) %}{% for x in range(300)|map('string')|map('center', 100000) %}"
                           "{% set ns.l = ns.l + [x] %}{% endfor %}{{ ns.l|length }}",
    "map_upper_growth": "{{ range(3000)|map('string')|map('replace', '', '\\u00df' * 100)|map('upper')|list|length }}",
    # other filters and methods whose result outgrows their input (escapes, case mapping, reprs)
    "escape_growth": "{{ ('<' * 900000)|escape }}",
    "forceescape_growth": "{{ ('&' * 900000)|forceescape|length }}",
    "upper_sharp_s": "{{ ('\\u00df' * 900000)|upper }}",
    "upper_ligature": "{{ ('\\ufb03' * 500000).upper()|length }}",
    "title_growth": "{{ ('\\ufb03 ' * 400000)|title|length }}",
    "pprint_growth": "{% set l = ['\\x00' * 100] * 9000 %}{{ l|pprint|length }}",
    "xmlattr_growth": "{{ {'a': '\"' * 900000}|xmlattr }}",
    "urlencode_growth": "{{ ('/' * 50000 + '\\u00e9' * 200000)|urlencode|length }}",
    "string_of_big_list": "{% set l = ['\\x00' * 100] * 9000 %}{{ l|string|length }}",
    "list_of_string": "{{ ('x' * 1000000)|list|length }}",
    "split_growth": "{{ ('a,' * 500000).split(',')|length }}",
    "splitlines_growth": "{{ ('\\n' * 900000).splitlines()|length }}",
    "recursive_namespace": "{% set ns = namespace(s='x' * 600000) %}{% set ns.t = ns %}{{ ns.t.t.t.s ~ ns.s }}",
}


# name -> why it is refused (a regex on the TemplateError's message): the guard that must catch it
REASONS = {
    'class_mro_subclasses': 'tried to access str\\.__class__',
    'base_subclasses_popen': 'tried to access list\\.__class__',
    'cycler_globals_os': 'tried to access type\\.__init__',
    'joiner_globals_os': 'tried to access type\\.__init__',
    'namespace_globals': 'tried to access type\\.__init__',
    'builtin_globals': 'tried to access function\\.__globals__',
    'self_context': 'tried to access TemplateReference\\._TemplateReference__context',
    'getitem_dunder': 'tried to access str\\.__class__',
    'attr_filter': 'tried to access str\\.__class__',
    'map_attribute': 'tried to access str\\.__class__',
    'format_attr': 'tried to access str\\.__class__',
    'format_map_attr': 'tried to access int\\.__class__',
    'type_mro': 'tried to access type\\.mro',
    'mutate_messages': 'tried to access list\\.append',
    'huge_range': 'passed an integer argument above 1048576',
    'range_over_cap': 'range\\(\\) of 1000000 items \\(limit 10000\\)',
    'nested_loops': 'ran more than 100000 loop iterations',
    'nested_string_loops': 'ran more than 100000 loop iterations',
    'string_multiplication': 'repetition would produce more than',
    'list_multiplication': 'repetition would make more than 100000 items',
    'doubling_concat': 'call arguments exceeds',
    'big_power': 'power is too large',
    'format_width': 'format width is too large',
    'format_nested_width': 'passed an integer argument above 1048576',
    'printf_width': 'format width is too large',
    'printf_star': 'passed an integer argument above 1048576',
    'format_filter': 'format width is too large',
    'center_filter': 'passed an integer argument above 1048576',
    'indent_filter': 'indent would produce more than',
    'join_bomb': 'join\\(\\) would produce more than',
    'str_join_bomb': 'join\\(\\) would produce more than',
    'replace_bomb': 'replace\\(\\) would produce more than',
    'expandtabs_bomb': 'expandtabs\\(\\) would produce more than 1048576 characters/elemen',
    'ljust_bomb': 'passed an integer argument above 1048576',
    'to_bytes_bomb': 'passed an integer argument above 1048576',
    'slice_bomb': 'passed an integer argument above 1048576',
    'tojson_indent': 'tojson indent above 64',
    'lipsum': "UndefinedError: 'lipsum' is undefined",
    'output_flood': 'output exceeds',
    'concat_chain': 'call arguments exceeds',
    'literal_list': 'call arguments exceeds',
    'nested_literal': 'call arguments exceeds',
    'set_block': 'block output exceeds',
    'macro_body': 'block output exceeds',
    'namespace_growth': 'output value exceeds',
    'namespace_cycle': '\\|string input exceeds',
    'macro_recursion': 'recursed too deeply',
    'recursive_loop': 'recursed too deeply',
    'deep_parentheses': 'is nested too deeply',
    'oversized_source': 'is larger than 65536 bytes',
    'tojson_separators': 'tojson separators must be two strings of at most 64 characte',
    'tojson_separators_items': 'tojson would produce more than',
    'tojson_indent_nested': 'tojson would produce more than',
    'tojson_escapes': '\\|tojson result exceeds',
    'translate_bomb': 'translate\\(\\) would produce more than 1048576 characters/element',
    'maketrans_bomb': 'translate\\(\\) would produce more than 1048576 characters/element',
    'join_attribute_bomb': 'join\\(\\) would produce more than',
    'join_mapped': 'join\\(\\) would produce more than',
    'zfill_bomb': 'passed an integer argument above 1048576',
    'center_method': 'passed an integer argument above 1048576',
    'rjust_over_cap': 'passed an integer argument above 1048576',
    'rjust_then_concat': 'call arguments exceeds',
    'wordwrap_bomb': 'wordwrap would produce more than',
    'indent_first_blank': 'indent would produce more than',
    'batch_count': 'batch count above 10000',
    'slice_count': 'slice count above 10000',
    'printf_dict_width': 'format width is too large',
    'format_map_width': 'format width is too large',
    'format_kwarg_width': 'passed an integer argument above 1048576',
    'format_index_width': 'format width is too large',
    'list_add_doubling': 'operator result exceeds',
    'str_add_doubling': '\\+ operands exceeds',
    'dict_fromkeys': 'call result exceeds',
    'loop_output': 'output exceeds',
    'encode_growth': 'call result exceeds',
    'urlize_growth': '\\|urlize would produce',
    'power_digits': 'power is too large',
    'product_chain': 'integer product is too large',
    'bytes_repetition': 'repetition would produce more than',
    'nested_list_repetition': 'repetition would produce more than',
    'deep_list_literal': 'is nested too deeply',
    'replace_growth': 'replace\\(\\) would produce more than',
    'dict_update': 'tried to access dict\\.update',
    'dunder_len': 'tried to access list\\.__len__',
    'tuple_base': 'tried to access tuple\\.__class__',
    'self_dict': 'tried to access TemplateReference\\.__dict__',
    'namespace_subclasses': 'tried to access type\\.__class__',
    'filter_chain': 'is nested too deeply',
    'format_many_fields': 'format\\(\\) would produce more than',
    'format_same_arg_many_times': 'format\\(\\) would produce more than',
    'format_named_many_times': 'format\\(\\) would produce more than',
    'format_map_many_times': 'format\\(\\) would produce more than',
    'format_precision_many': 'format\\(\\) would produce more than',
    'format_attr_many': 'format\\(\\) would produce more than',
    'format_nested_widths_many': 'format\\(\\) would produce more than',
    'printf_many_fields': 'chat template format would produce more than',
    'printf_dict_many': 'chat template format would produce more than',
    'printf_precision_many': 'chat template format would produce more than',
    'format_filter_many': 'chat template format would produce more than',
    'map_center_list': '\\|map result exceeds',
    'map_center_join': '\\|map result exceeds',
    'map_indent_list': 'indent would produce more than',
    'map_format_list': '\\|map result exceeds',
    'map_replace_list': '\\|map result exceeds',
    'map_tojson_list': '\\|map result exceeds',
    'map_string_of_lists': '\\|map result exceeds',
    'map_join_list': '\\|map result exceeds',
    'select_then_list': '\\|map result exceeds',
    'reject_then_list': '\\|map result exceeds',
    'unique_then_list': '\\|map result exceeds',
    'batch_then_list': '\\|map result exceeds',
    'map_chain_sum': '\\|map result exceeds',
    'map_then_tojson': '\\|map result exceeds',
    'map_in_loop_collect': '\\|map result exceeds',
    'map_upper_growth': '\\|map result exceeds',
    'escape_growth': '\\|escape result exceeds',
    'forceescape_growth': '\\|forceescape result exceeds',
    'upper_sharp_s': '\\|upper would produce more than',
    'upper_ligature': 'upper\\(\\) would produce more than',
    'title_growth': '\\|title would produce more than',
    'pprint_growth': '\\|pprint would produce more than',
    'xmlattr_growth': '\\|xmlattr result exceeds',
    'urlencode_growth': '\\|urlencode result exceeds',
    'string_of_big_list': '\\|string would produce more than',
    'list_of_string': '\\|list result exceeds',
    'split_growth': 'call result exceeds',
    'splitlines_growth': 'call result exceeds',
    'recursive_namespace': 'value exceeds',
}
assert len(HOSTILE) >= 120 and set(REASONS) == set(HOSTILE)  # (a collection error, not a test)
RSS_GROWTH_LIMIT = 256 << 20  # bytes one render may add to the process's peak resident size


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # restart VmHWM from the current RSS
        return True
    except OSError:
        return False


def _kb(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+)", Path("/proc/self/status").read_text(), re.M).group(1)) << 10



@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_template_is_refused_for_its_reason(name, tmp_path):
    """A TemplateError saying why (the guard meant for it), no shell command run, and (Linux) at
    most RSS_GROWTH_LIMIT of peak memory growth during the render. The time bound is loose (CI
    machines are shared): it catches a hang, the sandbox's own deadline is RENDER_SECONDS."""
    marker = tmp_path / "pwned"
    source = HOSTILE[name].replace("MARKER", str(marker))
    measured = _reset_peak()
    before = _kb("VmRSS") if measured else 0
    t0 = time.perf_counter()
    with pytest.raises(TemplateError, match=REASONS[name]):
        render_chat(source, MSGS)
    assert time.perf_counter() - t0 < 30.0  # (the acceptance's 2 s is measured on a quiet machine: bench/NOTES.md)
    if measured:
        growth = _kb("VmHWM") - before
        assert growth < RSS_GROWTH_LIMIT, f"{name} grew the process by {growth >> 20} MB"
    assert not marker.exists(), "the template executed a shell command"


@pytest.mark.parametrize("text", [
    "see www.a.io & <b> x@y.org", "www.a.io " * 50, "https://" + "&" * 40 + ".org", "mailto:x@y.org " * 20,
    "a" * 100, " " * 30, "x@y.org\t<'\">" * 10, "http://e.com/?q=\"'&<> www.b.io\nc@d.ef"])
@pytest.mark.parametrize("kw", [{}, {"nofollow": True}, {"target": "_bl&nk", "rel": "me \"x\""}])
def test_urlize_bound_holds(text, kw):
    """urlize is refused on a bound computed before it runs: the bound must never be below jinja's result."""
    import jinja2

    from minfer.tokenizer.chat import urlize_bound

    out = jinja2.Environment().from_string("{{ t|urlize(**kw) }}").render(t=text, kw=kw)
    assert len(out) <= urlize_bound(text, kw.get("target"), kw.get("rel")), out
    assert render_chat("{{ messages[0].content|urlize(**kw) }}", [{"role": "user", "content": text}], kw=kw) == out
