"""Chat templates are untrusted code: sandboxed, and rendered as transformers renders them.

The templates of the families the engine loads come from the files that carry
them: SmolLM2's from the default model's GGUF, Qwen2.5's, Qwen3's, Llama 3.2's
and Qwen3.5's from llama.cpp's copies of the models' tokenizer_config.json
inside the pinned llama-cpp-python source distribution (the llama.cpp peer,
fetched by `./dev setup`). Each renders identically to transformers'
`render_jinja_template` (what `apply_chat_template` calls) for 20 conversations.
"""

from __future__ import annotations

import tarfile
import time

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from rvascend.testing import llama_cpp
from rvascend.models import default_model
from rvascend.tokenizer import template_budget
from rvascend.tokenizer.chat_template import ChatTemplate, ChatTemplateError
from rvascend.models import gguf_checkpoint

_SDIST_TEMPLATES = {
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", {"eos_token": "<|im_end|>"}),
    "qwen3": ("Qwen-Qwen3-0.6B.jinja", {"eos_token": "<|im_end|>"}),
    "llama3.2": ("meta-llama-Llama-3.2-3B-Instruct.jinja",
                 {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    "qwen3.5": ("Qwen3.5-4B.jinja", {"eos_token": "<|im_end|>"}),
}


@pytest.fixture(scope="module")
def templates(tmp_path_factory) -> dict[str, tuple[str, dict[str, str]]]:
    out = {}
    with tarfile.open(llama_cpp.sdist_path()) as tar:
        for family, (name, specials) in _SDIST_TEMPLATES.items():
            member = next(m for m in tar.getmembers() if m.name.endswith(f"/models/templates/{name}"))
            out[family] = (tar.extractfile(member).read().decode("utf-8"), specials)
    path = default_model.extract_gguf(str(tmp_path_factory.mktemp("smollm2")), default_model.wheel_path(fetch=False))
    meta = gguf_checkpoint.GgufCheckpoint(path).meta
    tokens = meta["tokenizer.ggml.tokens"]
    out["smollm2"] = (meta["tokenizer.chat_template"],
                      {"bos_token": tokens[meta["tokenizer.ggml.bos_token_id"]],
                       "eos_token": tokens[meta["tokenizer.ggml.eos_token_id"]]})
    return out


def _conversations() -> list[list[dict[str, str]]]:
    sys_ = {"role": "system", "content": "You are a careful assistant."}
    u1 = {"role": "user", "content": "What is the capital of France?"}
    a1 = {"role": "assistant", "content": "Paris."}
    u2 = {"role": "user", "content": "And of Italy?"}
    a2 = {"role": "assistant", "content": "Rome."}
    return [
        [u1], [sys_, u1], [u1, a1, u2], [sys_, u1, a1, u2], [u1, a1], [sys_, u1, a1, u2, a2, u2],
        [{"role": "user", "content": "Ünïcødé — 中文 — 🚀 \"quotes\" <tags> & {braces}"}],
        [{"role": "user", "content": "  leading and trailing spaces  \n\nand blank lines\n"}],
        [u1, {"role": "assistant", "content": "<think>\nThe user asks a capital.\n</think>\n\nParis."}, u2],
        [sys_, {"role": "user", "content": ""}],
    ]


def _cases():
    for i, messages in enumerate(_conversations()):
        for add in (True, False):
            yield pytest.param(messages, add, id=f"conv{i}-{'gen' if add else 'nogen'}")


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "qwen3", "llama3.2", "qwen3.5"])
@pytest.mark.parametrize("messages,add", list(_cases()))
def test_renders_as_transformers(templates, family, messages, add):
    source, specials = templates[family]
    kwarg_sets = [{}]
    if family in ("qwen3", "qwen3.5"):
        kwarg_sets = [{}, {"enable_thinking": False}, {"enable_thinking": True}]
    for kwargs in kwarg_sets:
        try:
            (want,), _ = render_jinja_template(conversations=[messages], chat_template=source,
                                               add_generation_prompt=add, **specials, **kwargs)
        except Exception as e:  # the template refuses this conversation: so must ours, with its message
            with pytest.raises(ChatTemplateError, match="refused") as refused:
                ChatTemplate(source, specials).render(messages, add, template_kwargs=kwargs)
            assert str(e) in str(refused.value)
            continue
        assert ChatTemplate(source, specials).render(messages, add, template_kwargs=kwargs) == want


_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}]
_TOOL_TURNS = [
    [{"role": "user", "content": "Weather in Oslo?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Oslo?"},
     {"role": "assistant", "content": "", "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "c"}}}]},
     {"role": "tool", "tool_call_id": "call_1", "content": "4 C, rain"}],
]


@pytest.mark.parametrize("family", ["smollm2", "qwen2.5", "qwen3", "llama3.2", "qwen3.5"])
@pytest.mark.parametrize("turns", range(len(_TOOL_TURNS)))
def test_tools_render_as_transformers(templates, family, turns):
    """The tools reach the model as transformers' apply_chat_template(..., tools=...) puts
    them in the prompt, with an assistant's tool calls and the tool's answer after them."""
    source, specials = templates[family]
    messages = _TOOL_TURNS[turns]
    try:
        (want,), _ = render_jinja_template(conversations=[messages], chat_template=source, tools=_TOOLS,
                                           add_generation_prompt=True, **specials)
    except Exception as e:  # the template refuses this conversation: so must ours, with its message
        with pytest.raises(ChatTemplateError, match="refused") as refused:
            ChatTemplate(source, specials).render(messages, True, template_kwargs={"tools": _TOOLS})
        assert str(e) in str(refused.value)
        return
    got = ChatTemplate(source, specials).render(messages, True, template_kwargs={"tools": _TOOLS})
    assert got == want
    if family != "smollm2":  # SmolLM2's template has no tools section
        assert "get_weather" in got


def test_continue_final_message_matches_transformers(templates):
    source, specials = templates["qwen3"]
    messages = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "The colour is"}]
    (want,), _ = render_jinja_template(conversations=[messages], chat_template=source,
                                       continue_final_message=True, **specials)
    got = ChatTemplate(source, specials).render(messages, add_generation_prompt=False, continue_final_message=True)
    assert got == want and got.endswith("The colour is")


_ESCAPES = [
    "{{ cycler.__init__.__globals__.os.popen('touch MARKER').read() }}",
    "{{ joiner.__init__.__globals__.os.system('touch MARKER') }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ namespace.__init__.__globals__ }}",
    "{% set ns = namespace(_x=1) %}{{ ns._x }}",
    "{% set ns = namespace() %}{% set ns.__class__ = 1 %}",
    "{{ messages.append({'role': 'user'}) }}",
    "{{ messages[0].update({'content': 'x'}) }}",
    "{{ raise_exception.__globals__ }}",
    "{{ strftime_now.__globals__['datetime'] }}",
]


@pytest.mark.parametrize("source", _ESCAPES)
def test_sandbox_refuses_escapes(source, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = source.replace("MARKER", str(tmp_path / "pwned"))
    messages = [{"role": "user", "content": "hi"}]
    try:
        text = ChatTemplate(source).render(messages)
    except ChatTemplateError as e:
        assert "sandbox" in str(e) or "failed" in str(e) or "refused" in str(e)
    else:
        # Jinja's sandbox renders a refused attribute as undefined (empty), never its value.
        assert "function" not in text and "module" not in text and "class" not in text, text
    assert not (tmp_path / "pwned").exists()
    assert messages == [{"role": "user", "content": "hi"}]


# Templates that the sandbox alone lets run without bound (time or memory).
_BOMBS = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "string repeat": "{{ 'x' * 200000000 }}",
    "list repeat": "{{ ([0] * 200000000) | length }}",
    "percent width": "{{ '%0999999999d' % 1 }}",
    "format width": "{{ '{:>999999999}'.format(1) }}",
    "format width from an argument": "{{ '{:{}}'.format(1, 999999999) }}",
    "center method": "{{ 'x'.center(999999999) }}",
    "center filter": "{{ 'x' | center(999999999) }}",
    "power": "{{ 9 ** 99999999 }}",
    "doubling by ~": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s | length }}",
    "doubling by +": "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
                     "{% endfor %}{{ ns.s | length }}",
    "huge output": "{% for i in range(100000) %}{{ 'abcdefghij' * 1000 }}{% endfor %}",
    "replace": "{{ ('x' * 60000) | replace('x', 'y' * 60000) }}",
}


@pytest.mark.parametrize("name", sorted(_BOMBS))
def test_a_template_that_would_run_without_bound_is_stopped_by_name(name):
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="went over its budget"):
        ChatTemplate(_BOMBS[name]).render([{"role": "user", "content": "hi"}])
    assert time.monotonic() - start < template_budget.MAX_SECONDS + 2
    with pytest.raises(ChatTemplateError):
        ChatTemplate(_BOMBS[name]).probe()


def test_real_templates_render_well_within_the_budget(templates):
    """The families' own templates, with tools and a long conversation, use a small
    share of the line budget (so the budget refuses no real model)."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(201)]
    for family, (source, specials) in templates.items():
        budget = template_budget.LineBudget()
        template = ChatTemplate(source, specials)
        template.probe()
        with budget:
            template._template.render(messages=messages, add_generation_prompt=True)
        assert 0 < budget.lines < template_budget.MAX_LINES // 50, (family, budget.lines)


def test_transformers_environment():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}{{ m.content }}"
                     "{% endfor %}|{{ messages | tojson }}|{{ {'b': 1, 'a': '<é>'} | tojson(indent=1) }}"
                     "|{{ strftime_now('%Y') | length }}")
    messages = [{"role": "user", "content": c} for c in "xyz"]
    text = t.render(messages, add_generation_prompt=False)
    assert text.startswith("xy|")
    assert '[{"role": "user", "content": "x"}' in text            # key order kept
    assert '{\n "b": 1,\n "a": "<é>"\n}' in text                   # no HTML escaping, non-ASCII kept
    assert text.endswith("|4")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        ChatTemplate("{{ raise_exception('roles must alternate') }}").render(messages)
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}")
