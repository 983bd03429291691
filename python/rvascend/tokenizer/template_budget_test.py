"""The chat-template budget holds where the work happens outside the template's own
lines: in `tojson` over a client's JSON, and in filters that run untraced."""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest

from rvascend.tokenizer import template_budget
from rvascend.tokenizer.chat_template import ChatTemplate, ChatTemplateError

_HI = [{"role": "user", "content": "hi"}]
# How Llama 3.1's template writes the request's tools into the prompt.
_TOOLS_AS_INDENTED_JSON = "{% for t in tools %}{{ t | tojson(indent=4) }}{{ '\\n\\n' }}{% endfor %}"


def test_indented_tojson_of_deep_client_json_is_refused_before_it_is_built():
    """300 KB of tool parameters nested 300 deep indent to 122 M characters: json.dumps
    built them all (5.1 s, +239 MiB) before the size check refused the result."""
    parameters = [0] * 100_000
    for _ in range(300):
        parameters = {"a": parameters}
    tools = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    template = ChatTemplate(_TOOLS_AS_INDENTED_JSON)
    tracemalloc.start()
    try:
        start = time.monotonic()
        with pytest.raises(ChatTemplateError, match="went over its budget"):
            template.render(_HI, template_kwargs={"tools": tools})
        took = time.monotonic() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # At most the size limit's worth of text (1 byte a character here) is ever held.
    assert peak < 2 * template_budget.MAX_SIZE, f"{peak / 2**20:.0f} MiB"
    assert took < 1.5, f"{took:.2f} s"


def test_tojson_indent_is_capped_and_its_text_is_json_dumps():
    with pytest.raises(ChatTemplateError, match=r"tojson\(indent=100\)"):
        ChatTemplate("{{ messages | tojson(indent=100) }}").render(_HI)
    with pytest.raises(ChatTemplateError, match="tojson"):
        ChatTemplate("{{ messages | tojson(indent=' ' * 100) }}").render(_HI)
    value = {"b": [1, 2.5, None, True, {"é": "<\u2028>"}], "a": {"x": [], "y": {}}, "c": "\"quoted\"\n"}
    for options in ({}, {"indent": 4}, {"indent": "\t"}, {"sort_keys": True, "indent": 2},
                    {"separators": [",", ":"]}, {"ensure_ascii": True}):
        text = ChatTemplate("{{ v | tojson(**options) }}").render(_HI, template_kwargs={"v": value,
                                                                                     "options": options})
        assert text == json.dumps(value, **{"ensure_ascii": False, **options}), options


_SLOW_FILTERS = {
    # Three template lines an iteration, each filter ~0.1 s: the deadline, checked every
    # 1024 lines, let it run 22.6 s against a 5 s budget.
    "a loop": "{% set s = 'x' * 2000000 %}{% for i in range(100000) %}{% set t = s | list | join %}"
              "{% endfor %}",
    # One template line: only the filters themselves see the deadline.
    "one expression": "{% set s = 'x' * 2000000 %}{{ (s" + " | list | join" * 40 + ") | length }}",
}


@pytest.mark.parametrize("name", sorted(_SLOW_FILTERS))
def test_heavy_filters_stop_at_the_deadline(name, monkeypatch):
    monkeypatch.setattr(template_budget, "MAX_SECONDS", 0.5)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="ran over 0.5 s"):
        ChatTemplate(_SLOW_FILTERS[name]).render(_HI)
    took = time.monotonic() - start
    assert took < 4 * 0.5, f"{took:.2f} s"
