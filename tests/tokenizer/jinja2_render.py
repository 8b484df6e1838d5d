#!/usr/bin/env python3
"""jinja2_render.py - the second template oracle: renders chat templates with Python's jinja2 set up
the way transformers' apply_chat_template sets it up (what SGLang and vLLM run), so the template
tests can hold moeserve to the engine the models were trained with, not only to the JS port.

Environment (as transformers builds it): ImmutableSandboxedEnvironment with trim_blocks=True,
lstrip_blocks=True, the loopcontrols extension and a `{% generation %}` block tag (transformers'
AssistantTracker; here it only renders its body); the `tojson` filter is json.dumps with
ensure_ascii=False, sort_keys=False unless the template asks otherwise; globals raise_exception
(raises TemplateError with the message) and strftime_now (datetime.now().strftime).

Protocol (one process renders many cases): stdin holds JSON lines, either
  {"define": ID, "src": TEMPLATE_SOURCE}
or
  {"t": ID, "job": {"messages": [...], "tools": ..., "add_generation_prompt": ..., "kwargs": {...}},
   "bos": STR|null, "eos": STR|null}
For each job line, stdout gets one JSON line: {"text": RENDERING} or {"error": MESSAGE}. A template
that fails to compile answers {"error": ...} for each of its jobs. Numbers in a job keep the
spelling they have in the input (1.0 stays a float, 1 an int), as json.loads gives them.
"""
import json
import sys
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:  # the caller reports the oracle as missing
    sys.stdout.write(json.dumps({"fatal": "python3 has no jinja2 module (apt-get install python3-jinja2)"}) + "\n")
    sys.exit(3)


class GenerationBlock(Extension):
    """{% generation %}...{% endgeneration %}: transformers marks assistant spans with it; the text
    renders unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

    def _render_body(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def context(job, bos, eos):
    """What apply_chat_template passes to render(): messages, tools (None when absent),
    add_generation_prompt, the special tokens that are set, then the template kwargs."""
    ctx = {"messages": job.get("messages"), "tools": job.get("tools"),
           "add_generation_prompt": bool(job.get("add_generation_prompt"))}
    if bos is not None:
        ctx["bos_token"] = bos
    if eos is not None:
        ctx["eos_token"] = eos
    ctx.update(job.get("kwargs") or {})
    return ctx


def main():
    env = make_env()
    templates = {}
    out = sys.stdout
    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        if "define" in req:
            try:
                templates[req["define"]] = env.from_string(req["src"])
            except Exception as e:  # noqa: BLE001 - any compile failure is an answer
                templates[req["define"]] = e
            continue
        tpl = templates.get(req["t"])
        try:
            if tpl is None:
                raise KeyError("template %r was not defined" % (req["t"],))
            if isinstance(tpl, Exception):
                raise tpl
            res = {"text": tpl.render(**context(req["job"], req.get("bos"), req.get("eos")))}
        except Exception as e:  # noqa: BLE001
            res = {"error": "%s: %s" % (type(e).__name__, e)}
        out.write(json.dumps(res, ensure_ascii=False) + "\n")
    out.flush()


if __name__ == "__main__":
    main()
