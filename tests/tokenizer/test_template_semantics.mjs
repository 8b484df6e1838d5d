// test_template_semantics.mjs - one small template per Jinja feature (statements, whitespace
// control, operators, filters, tests, methods, undefined handling, errors), each rendered by both
// oracles (Python jinja2 as transformers sets it up, and @huggingface/jinja) and by `moeserve
// template --jsonl`. moeserve must agree byte for byte with jinja2 (or both fail); the snippets in
// STILL_JS are the documented gaps (docs/templates.md) where moeserve does not match jinja2 yet: they
// are reported, not counted. The snippets cover the engine beyond what real
// chat templates happen to use.
import { oracleRender, moeserveRender, compare, jinja2RenderMany } from "../fixtures/templates/harness.mjs";

const CTX = {
  s: "Hello World", u: "  Ünï 😀 café\n", e: "", n: 7, f: 2.5, fi: 3.0, neg: -4, b: true, nb: false, z: null,
  arr: [3, 1, 2], sarr: ["b", "A", "c", "a"], objs: [{ name: "x", v: 2, ok: true }, { name: "y", v: 1, ok: false }, { name: "z", v: 3 }],
  obj: { b: 1, a: "two", c: [1, 2], d: { e: null } }, msgs: [{ role: "user", content: "hi" }, { role: "assistant", content: "yo" }],
  mixed: [1, "a", null, true, 2.5, [1, 2], { k: "v" }], nested: { a: { b: { c: "deep" } } }, big: 12345678901234, tiny: 1e-7, huge: 1e21,
};

const CASES = [
  // literals and printing
  "{{ 'a' }}{{ \"b\" }}{{ 'c' 'd' }}", "{{ 1 }}|{{ 1.0 }}|{{ 1.5 }}|{{ -0.0 }}|{{ 10 / 4 }}|{{ 10 / 5 }}", "{{ true }}|{{ false }}|{{ none }}|{{ True }}|{{ None }}",
  "{{ [1, 'a', none, true, 1.0] }}", "{{ {'a': 1, 'b': [1, 2], 'c': {'d': none}} }}", "{{ (1, 2) }}", "{{ obj }}", "{{ mixed }}",
  "{{ big }}|{{ tiny }}|{{ huge }}|{{ fi }}|{{ f }}", "{{ 'x\\ny\\t\\'q\\'\\\\' }}", "{{ '\\u00e9\\x41' }}", "{{ undefined_var }}|{{ z }}",
  // whitespace control and blocks
  "a  {%- if true -%}  b  {%- endif -%}  c", "a\n  {% if true %}\n  b\n  {% endif %}\nc\n", "x {# comment #} y {#- trimmed -#} z",
  "  {{- 'a' -}}  \n  {{ 'b' }}  ", "line\n    {% set x = 1 %}\n    after", "{% if true %}\ntext\n{% endif %}\n", "a {%- generation -%} b {% endgeneration %} c",
  "{% for i in [1,2,3] %}\n  item {{ i }}\n{% endfor %}\n", "{%- for i in arr -%}\n{{ i }},\n{%- endfor %}",
  // if / for / loop
  "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}", "{% if z %}y{% elif e %}e{% else %}n{% endif %}",
  "{% for x in arr %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
  "{% for x in arr %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", "{% for x in [] %}a{% else %}empty{% endfor %}",
  "{% for x in arr if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}", "{% for k, v in obj.items() %}{{ k }}={{ v }};{% endfor %}",
  "{% for k in obj %}{{ k }}{% endfor %}", "{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }}{% endfor %}", "{% for a, b in [(1, 2)] %}{{ a }}{% endfor %}",
  "{% for x in arr %}{% if x == 1 %}{% continue %}{% endif %}{{ x }}{% endfor %}", "{% for x in arr %}{{ x }}{% if x == 1 %}{% break %}{% endif %}{% endfor %}",
  "{% for x in arr %}{% continue %}{% else %}else-ran{% endfor %}", "{% for x in arr %}{% for y in sarr %}{{ loop.index }}{% endfor %}{{ loop.index }}|{% endfor %}",
  "{% for x in 'abc' %}{{ x }}{% endfor %}", "{% for x in undefined_var %}{{ x }}{% endfor %}", "{% for m in msgs %}{{ m.role }}:{{ m['content'] }} {% endfor %}",
  "{% for i in range(3) %}{{ i }}{% endfor %}|{% for i in range(1, 7, 2) %}{{ i }}{% endfor %}|{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}",
  // set / namespace / scoping
  "{% set x = 5 %}{{ x }}{% set x = x + 1 %}{{ x }}", "{% set a, b = 1, 2 %}{{ a }}{{ b }}", "{% set x %}block {{ n }}{% endset %}[{{ x }}]",
  "{% set ns = namespace(c=0, s='') %}{% for i in arr %}{% set ns.c = ns.c + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.c }}|{{ ns.s }}",
  "{% set x = 1 %}{% for i in arr %}{% set x = i %}{% endfor %}{{ x }}", "{% set ns = namespace(a=1) %}{{ ns }}", "{% set ns = namespace({'k': 2}) %}{{ ns.k }}",
  "{% if true %}{% set y = 3 %}{% endif %}{{ y }}", "{% set obj2 = {'a': 1} %}{% set obj2.a = 2 %}",
  // macros
  "{% macro greet(name, greeting='Hi') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Bob') }} {{ greet('Al', 'Yo') }} {{ greet(name='Cy', greeting='Hey') }}",
  "{% macro m(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ m('x') }}", "{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}",
  "{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", "{% macro m(a) %}{{ outer }}{% endmacro %}{% set outer = 'seen' %}{{ m(1) }}",
  "{% macro rec(n) %}{{ n }}{% if n > 0 %}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
  "{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}inside {{ n }}{% endcall %}",
  "{% macro row(x) %}<{{ caller(x * 2) }}>{% endmacro %}{% call(v) row(4) %}v={{ v }}{% endcall %}",
  "{% filter upper %}shout {{ s }}{% endfilter %}", "{% filter replace('o', '0') %}foo boo{% endfilter %}",
  // operators
  "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 * 3.0 }} {{ 1 / 0 }}",
  "{{ 1 + 2 * 3 - 4 }} {{ (1 + 2) * 3 }} {{ -n }} {{ +n }} {{ - -n }} {{ -f }}", "{{ 'a' ~ 1 ~ 1.0 ~ 2.5 ~ true ~ [1, 'x'] ~ obj }}",
  "{{ 'a' + 1 }}|{{ 1 + 'a' }}|{{ 'x' + [1, 2] }}|{{ 'v' + 1.0 }}", "{{ [1, 2] + [3] }}", "{{ 'a' ~ none }}", "{{ 'a' + undefined_var }}",
  "{{ 1 == 1.0 }} {{ '1' == 1 }} {{ '' == 0 }} {{ true == 1 }} {{ none == undefined_var }} {{ 'a' != 'b' }} {{ arr == arr }} {{ [1] == [1] }}",
  "{{ 1 < 2 }} {{ 2.5 >= 2 }} {{ 'a' < 'b' }}", "{{ 'ell' in s }} {{ 'x' not in s }} {{ 2 in arr }} {{ 5 not in arr }} {{ 'a' in obj }} {{ 'q' in obj }}",
  "{{ 1 in undefined_var }} {{ 1 not in undefined_var }}", "{{ undefined_var in arr }}", "{{ 1 in none }}",
  "{{ true and 'x' }} {{ false or 'y' }} {{ 0 or [] or 'z' }} {{ not e }} {{ not not n }} {{ 'a' if n > 1 else 'b' }} {{ 'shown' if b }}|{{ 'hidden' if nb }}|",
  "{{ n > 1 and n < 10 or false }}", "{{ 1 if false else 2 if false else 3 }}",
  // member access, indexing, slicing
  "{{ msgs[0].role }} {{ msgs[-1]['content'] }} {{ msgs[5] }} {{ obj.d.e }} {{ obj['c'][1] }} {{ nested.a.b.c }} {{ obj.missing.deeper }}",
  "{{ s[0] }}{{ s[-1] }}{{ s[100] }}|{{ u[2] }}", "{{ arr[1:] }} {{ arr[:2] }} {{ arr[::-1] }} {{ arr[::2] }} {{ arr[-2:] }} {{ arr[1:2] }}",
  "{{ s[::-1] }}|{{ s[2:5] }}|{{ u[1:6] }}|{{ u[::-1] }}", "{{ arr[3:-1:-1] }} {{ arr[0:3:0] }}", "{{ none[0] }}", "{{ undefined_var.x }}|{{ undefined_var['x'] }}",
  "{{ arr.length }} {{ s.length }} {{ u.length }} {{ obj.length }}", "{{ msgs.0.role }}", "{{ n.real }}",
  // string methods
  "{{ s.upper() }} {{ s.lower() }} {{ u.strip() }}|{{ u.lstrip() }}|{{ u.rstrip() }}|{{ '--x--'.strip('-') }}", "{{ 'hello world'.title() }} {{ 'élan vital x'.title() }} {{ 'hELLO'.capitalize() }}",
  "{{ s.startswith('He') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'Hel')) }} {{ s.endswith('') }}",
  "{{ 'a,b,,c'.split(',') }} {{ '  a  b c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a-b-c'.split('-', 0) }} {{ ' x  y '.split(none, 1) }}",
  "{{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 2) }} {{ 'abc'.replace('', '-') }} {{ 'abc'.replace('', '-', 2) }}",
  "{{ 'ß straße'.upper() }} {{ 'ÀÉÎ'.lower() }}",
  // dict methods
  "{{ obj.get('a') }} {{ obj.get('zz') }} {{ obj.get('zz', 'dflt') }} {{ obj.keys() }} {{ obj.values() }} {{ obj.items() }}",
  "{{ obj.dictsort() }} {{ {'b': 2, 'a': 3}.dictsort(by='value') }} {{ {'B': 1, 'a': 2}.dictsort(reverse=true) }}",
  // filters
  "{{ s | length }} {{ arr | length }} {{ obj | length }} {{ u | length }}", "{{ s | upper }} {{ s | lower }} {{ 'x y' | title }} {{ 'abc' | capitalize }}",
  "[{{ u | trim }}]", "{{ arr | first }} {{ arr | last }} {{ sarr | join }} {{ sarr | join(', ') }} {{ mixed | join('|') }} {{ 'abc' | join('-') }}",
  "{{ arr | sort }} {{ sarr | sort }} {{ sarr | sort(reverse=true) }} {{ sarr | sort(case_sensitive=true) }} {{ objs | sort(attribute='v') | map(attribute='name') | join }}",
  "{{ arr | reverse }} {{ [1, 2, 1, '1', 2] | unique }} {{ arr | list }}", "{{ 'x' | list }}",
  "{{ objs | selectattr('ok') | map(attribute='name') | list }} {{ objs | rejectattr('ok') | map(attribute='name') | list }}",
  "{{ objs | selectattr('name', 'equalto', 'y') | map(attribute='v') | first }} {{ objs | map(attribute='ok', default='?') | list }}",
  "{{ msgs | map(attribute='role') | join(',') }} {{ objs | map(attribute='missing') | list }}",
  "{{ obj | tojson }}|{{ mixed | tojson }}|{{ 'é\"\\n' | tojson }}|{{ undefined_var | tojson }}|{{ none | tojson }}",
  "{{ obj | tojson(indent=2) }}", "{{ obj | tojson(indent=2, separators=(',', ':')) }}", "{{ {'é': 'ü😀'} | tojson(ensure_ascii=true) }}",
  "{{ {'b': 1, 'a': {'d': 1, 'c': 2}} | tojson(sort_keys=true) }}", "{{ [] | tojson(indent=4) }}{{ {} | tojson(indent=4) }}", "{{ (1, 2) | tojson }}",
  "{{ '12' | int }} {{ '12abc' | int }} {{ 'x' | int }} {{ 'x' | int(5) }} {{ 3.9 | int }} {{ -3.9 | int }} {{ '2.5' | float }} {{ 'x' | float }} {{ true | int }} {{ 7 | float }}",
  "{{ n | string }} {{ f | string }} {{ fi | string }} {{ b | string }} {{ arr | string }} {{ 3.0 | int(0) }}", "{{ neg | abs }} {{ -2.5 | abs }}",
  "{{ undefined_var | default('dv') }} {{ z | default('dz') }} {{ e | default('de', true) }} {{ e | default('de2', boolean=true) }} {{ s | default('x') }}",
  "{{ 'line1\\nline2\\n\\nline4' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width=3, blank=true) }}",
  "{{ 'aXbX' | replace('X', '-') }} {{ 'aXbX' | replace('X', '-', 1) }}", "{{ s | safe }}", "{{ obj | items }}", "{{ b | bool }}",
  "{{ undefined_var | length }}", "{{ undefined_var | lower }}", "{{ z | trim }}", "{{ obj | keys }}", "{{ [] | first }}",
  // tests
  "{{ n is number }} {{ f is number }} {{ n is integer }} {{ f is integer }} {{ fi is integer }} {{ b is boolean }} {{ n is boolean }}",
  "{{ s is string }} {{ arr is iterable }} {{ s is iterable }} {{ obj is iterable }} {{ obj is mapping }} {{ arr is mapping }} {{ (1,2) is iterable }}",
  "{{ arr is sequence }} {{ obj is sequence }} {{ s is sequence }} {{ n is sequence }}", "{{ z is none }} {{ undefined_var is none }} {{ z is not none }}",
  "{{ undefined_var is defined }} {{ undefined_var is undefined }} {{ n is defined }} {{ obj.zz is defined }} {{ msgs[0].role is defined }}",
  "{{ n is odd }} {{ n is even }} {{ b is true }} {{ 1 is true }} {{ nb is false }} {{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 1 is lower }}",
  "{{ greet is callable }} {{ range is callable }} {{ n is callable }}", "{{ f is odd }}", "{{ n is divisibleby(7) }}", "{{ n is foo }}",
  // errors and raise_exception
  "{{ raise_exception('boom: ' ~ n) }}", "before{% if n > 1 %}{{ raise_exception('stop') }}{% endif %}after", "{{ nope() }}", "{{ 1 + }}",
  "{% if true %}unterminated", "{% for x in arr %}{{ x }}", "{% endif %}", "{{ 'unterminated }}", "{% raw %}x{% endraw %}", "{% include 'x' %}",
  "{% break %}", "{{ {1: 2} }}", "{{ obj[1] }}", "{{ arr['x'] }}", "{{ arr[1.5] }}", "{{ s.nomethod() }}", "{{ 'a' - 1 }}", "{{ [1] < [2] }}", "{% set n.x = 1 %}",
  "{{ 1 is }}", "{{ a | }}", "{{ x.(1) }}", "{% for %}{% endfor %}", "{% macro %}{% endmacro %}",
  // odd but valid lexing
  "{{ 1-1 }} {{ n-1 }} {{ n - -1 }} {{ [1,-2] }} {{ -1 }} {{ (-1) }}", "{{x}}{{s}}", "{{ {'a': {'b': 1}} }}", "{{ 'a' if true else 'b' }}{{'}}'}}",
  "{%if true%}y{%endif%}", "{% if true -%}\n  x\n{%- endif %}", "{{ '%}' }}", "  {% if true %}\n  indented\n  {% endif %}\n",
  "{# a #}\n{% if true %}\nx\n{% endif %}", "{{- ' lead' }}", "{{ 1.5e3 }}", "{{ 0.1 + 0.2 }}", "{{ 100000000000000000000 }} {{ 1000000000000000000000 }} {{ 0.000001 }} {{ 0.0000001 }}",
  "{{ strftime_now('%Y') | length }}", "{{ '%d' | length }}",
  // line endings and unusual whitespace in the template source
  "a\r\n  {% if true %}\r\n  b\r\n  {% endif %}\r\nc", "x\u2028  {% if true %}y{% endif %}\u2029\t{% if true %}z{% endif %}",
  "\t\t{%- if true %}\n\tv\n{% endif -%}\n\n end", "{% for x in arr -%}\n  {{ x }}\n{%- endfor %}\n", "  {#- c -#}  \n  {# d #}\n e",
  "a\n{%- generation %}\n b \n{% endgeneration -%}\n c", "50%}\ntext {- not a tag", "{{ '\u3000x\u3000' | trim }}|{{ '\ufeffy' | trim }}",
];

// Extensions: Python jinja2 filters/methods the oracle lacks (it fails on every one of these). The
// expected strings were produced by Python jinja2 3.1 (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, as transformers renders) with the same context.
const EXT_CTX = { s: "Hello World", arr: [3, 1, 2], f: 2.5, objs: [1, 0, 2, "a", ""], e: "" };
const EXTENSIONS = [
  ["{{ s | wordcount }}|{{ 'héllo wörld_x 42, ok' | wordcount }}", "2|4"],
  ["{{ arr | count }} {{ s | count }} {{ {'a': 1} | count }}", "3 11 1"],
  ["{{ s | d('x') }}|{{ nope | d('dv') }}|{{ e | d('de', true) }}|{{ nope | d }}|", "Hello World|dv|de||"],
  ["{{ f | round }} {{ 2.567 | round(2) }} {{ -2.5 | round }} {{ 3.5 | round }} {{ 2.1 | round(0, 'ceil') }} {{ 2.9 | round(method='floor') }} {{ 3 | round }}",
    "2.0 2.57 -2.0 4.0 3.0 2.0 3"],
  ["{{ objs | select | join(',') }}|{{ objs | reject | join(',') }}|{{ arr | select('odd') | join(',') }}|{{ arr | reject('equalto', 1) | join(',') }}",
    "1,2,a|0,|3,1|3,2"],
  ["{{ '<a href=\"x\">&\\'</a>' | escape }} {{ 'x<y' | e }}", "&lt;a href=&#34;x&#34;&gt;&amp;&#39;&lt;/a&gt; x&lt;y"],
  ["{{ s.find('o') }} {{ s.find('zz') }} {{ 'aaa'.count('a') }} {{ 'abab'.count('ab') }} {{ 'é😀x'.find('x') }}", "4 -1 3 2 2"],
  ["{{ 'a,b,c'.rsplit(',', 1) | join('|') }} {{ ' a  b c '.rsplit() | join('|') }} {{ 'a b c'.rsplit(none, 1) | join('|') }} {{ '-'.join(['x', 'y', 'z']) }}",
    "a,b|c a|b|c a b|c x-y-z"],
];

// Indices into CASES where moeserve does not match jinja2 yet (docs/templates.md, "not yet"): tuple unpacking of tuple literals, break keeping the iteration's output, varargs as a
// tuple, string/list ordering, strict undefined attribute chains, zero slice steps, none/float
// indexing, .length and int attributes, title/capitalize, dict views and generators, filters jinja2
// lacks (bool, keys) or treats otherwise (list of a string, first of []), macro callability,
// is odd on floats, test arguments without parentheses, raw blocks, non-string dict keys, exponent
// literals, CRLF normalisation, lstrip_blocks on Unicode spaces, and a trailing "%}" line.
const STILL_JS = new Set([30, 32, 50, 66, 74, 78, 79, 80, 81, 83, 85, 90, 91, 97, 98, 116, 117, 121, 122, 129, 130, 131, 141, 144, 145, 147, 150, 167, 172, 173, 178]);

const jobs = CASES.map((src) => ({ template: src, messages: [], kwargs: CTX }));
const got = moeserveRender([], jobs);
const py = jinja2RenderMany(CASES.map((src) => ({ src, jobs: [{ messages: [], kwargs: CTX }] }))).map((x) => x[0]);
let pass = 0, fail = 0, disagree = 0, gaps = 0;
CASES.forEach((src, i) => {
  const js = oracleRender(src, { messages: [], kwargs: CTX });
  if (compare(py[i], js) !== null) disagree++;
  const d = compare(py[i], got[i]);
  if (STILL_JS.has(i)) {
    if (d !== null) gaps++;
    else console.log(`case ${i} now matches jinja2: take it out of STILL_JS`);
  } else if (d === null) pass++;
  else {
    fail++;
    console.error(`FAIL case ${i} ${JSON.stringify(src)}: ${d.replace("oracle", "jinja2")}`);
  }
});
const extGot = moeserveRender([], EXTENSIONS.map(([src]) => ({ template: src, messages: [], kwargs: EXT_CTX })));
EXTENSIONS.forEach(([src, want], i) => {
  const oracle = oracleRender(src, { messages: [], kwargs: EXT_CTX });
  if (extGot[i].text === want && oracle.error !== undefined) pass++;
  else {
    fail++;
    console.error(`FAIL extension ${JSON.stringify(src)}: moeserve ${JSON.stringify(extGot[i])}, want ${JSON.stringify(want)} (oracle: ${JSON.stringify(oracle)})`);
  }
});
console.log(`${CASES.length} snippets compared with jinja2 (the oracles disagree on ${disagree}; ${gaps} known gaps not counted), ${EXTENSIONS.length} extensions`);
console.log(`## test_template_semantics: ${pass} passed, ${fail} failed`);
process.exit(fail ? 1 : 0);
