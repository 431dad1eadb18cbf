"""A checkpoint's chat template renders within `TemplateLimits` (`resin.recipe.sandbox`): a
hostile template's size, recursion or time bomb is a `TemplateLimitError` (the client's 400,
naming the limit) that comes fast, without the memory, while a plain request beside it is
answered."""

from __future__ import annotations

import dataclasses
import resource
import threading
import time

import httpx
import pytest

from resin.recipe import JinjaRecipe, Message
from resin.recipe.sandbox import render_template
from resin.recipe.template_limits import TemplateLimitError, TemplateLimits
from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.recipe.assets import smollm2_tokenizer
from tests.server.doubles import FakeEngine

RSS_CAP_MB = 200
"""What one hostile render may add to the process's peak RSS (the documented bound:
`max_chars` items a step, a few steps at once; 8 M chars -> tens of MB)."""

BOMBS = {
    "multiply": "{{ 'x' * 2000000000 }}",
    "power": "{{ 2 ** 1000000000 }}",
    "doubling": "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "list doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
    "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "replace": "{% set s = 'a' * 100000 %}{{ s.replace('a', s) }}",
    "join": "{% set s = 'a' * 100000 %}{{ ([s] * 100000)|join }}",
    "percent width": "{{ '%999999999d' % 1 }}",
    "format width": "{{ '{:>999999999}'.format(1) }}",
    "center": "{{ 'a'|center(999999999) }}",
    "indent": "{% set s = '\n' * 1000000 %}{{ s|indent(1000) }}",
    "output": "{% for i in range(99999) %}{{ 'y' * 9999 }}{% endfor %}",
    "nested ranges": "{% for a in range(99999) %}{% for b in range(99999) %}"
    "{% for c in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
    "string loops": "{% set s = 'a' * 1000000 %}{% for a in s %}{% for b in s %}"
    "{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "recursive loop": "{% for x in [1] recursive %}{{ loop([x]) }}{% endfor %}",
}
LIMIT_WORDS = {"max-chars": "--template-max-chars", "time": "--template-timeout"}

FAST = TemplateLimits(timeout_s=1.0)


@pytest.mark.parametrize("name", sorted(BOMBS))
def test_hostile_templates_stop_at_a_limit(name: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(TemplateLimitError) as info:
        render_template(BOMBS[name], FAST, messages=[])
    assert time.monotonic() - started < 3.0
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < RSS_CAP_MB, f"{name}: peak RSS grew {grown_mb:.0f} MB"
    assert "limit" in str(info.value) or "width" in str(info.value)


def test_ordinary_templates_render_unchanged() -> None:
    source = (
        "{% macro tag(m) %}<{{ m.role }}>{% endmacro %}"
        "{% for m in messages %}{{ tag(m) }}{{ m.content|trim }}{% if not loop.last %}|"
        "{% endif %}{% endfor %}{% filter upper %}end{% endfilter %}"
        "{% set tail | lower %}X{% endset %}{{ tail }}{{ '%-4s' % 'a' }}{{ '{:>3}'.format(1) }}"
        "{{ range(3)|join(',') }}{{ 'ab' * 2 }}{{ 2 ** 10 }}"
    )
    messages = [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"}]
    assert (
        render_template(source, FAST, messages=messages) == "<user>hi|<assistant>yoENDxa     1"
        "0,1,2abab1024"
    )


def test_limits_are_configurable() -> None:
    template = "{% for i in range(1000) %}{{ i }}{% endfor %}"
    render_template(template, TemplateLimits(max_chars=10_000), messages=[])
    with pytest.raises(TemplateLimitError, match="--template-max-chars"):
        render_template(template, TemplateLimits(max_chars=100), messages=[])
    deep = "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(20) }}"
    render_template(deep, TemplateLimits(max_depth=30), messages=[])
    with pytest.raises(TemplateLimitError, match="--template-max-depth"):
        render_template(deep, TemplateLimits(max_depth=10), messages=[])


HOSTILE_CHAT = (
    "{% for m in messages %}"
    "{% if m.content == 'spin' %}{% for a in range(99999) %}{% for b in range(99999) %}"
    "{% endfor %}{% endfor %}"
    "{% elif m.content == 'grow' %}{{ 'x' * 2000000000 }}"
    "{% elif m.content == 'recurse' %}{{ f(m) }}"
    "{% endif %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
HOSTILE_CHAT = "{% macro f(m) %}{{ f(m) }}{% endmacro %}" + HOSTILE_CHAT


def test_a_hostile_render_is_a_400_while_a_plain_request_is_answered() -> None:
    tokenizer = smollm2_tokenizer()
    tokenizer = type(tokenizer)(
        tokenizer.backend, dataclasses.replace(tokenizer.info, chat_template=HOSTILE_CHAT)
    )
    recipe = JinjaRecipe(tokenizer, limits=TemplateLimits(timeout_s=2.0))
    reply = tokenizer.encode("ok")
    engine = FakeEngine(lambda prompt: list(reply), vocab_size=tokenizer.vocab_size)
    server = HttpServer(engine, recipe, tokenizer=tokenizer, model="m", port=free_port())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def ask(url: str, text: str) -> httpx.Response:
        body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": text}]}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=30)

    with running(server) as url:
        for bomb, limit in (("spin", "time"), ("grow", "max-chars"), ("recurse", "max-depth")):
            answers: dict[str, httpx.Response] = {}
            took: dict[str, float] = {}

            def send(
                text: str,
                answers: dict[str, httpx.Response] = answers,
                took: dict[str, float] = took,
            ) -> None:
                started = time.monotonic()
                answers[text] = ask(url, text)
                took[text] = time.monotonic() - started

            hostile = threading.Thread(target=send, args=(bomb,))
            hostile.start()
            time.sleep(0.2)
            send("hello")  # beside the hostile render
            hostile.join(30)
            assert answers["hello"].status_code == 200, answers["hello"].text
            assert took["hello"] < 5.0
            assert answers[bomb].status_code == 400, answers[bomb].text
            assert f"--template-{limit}" in answers[bomb].text
            assert took[bomb] < 5.0
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < RSS_CAP_MB


def test_a_plain_conversation_renders_as_before() -> None:
    tokenizer = smollm2_tokenizer()
    recipe = JinjaRecipe(tokenizer)
    text = recipe.render([Message("user", "Hi")]).text
    assert text.endswith("<|im_start|>assistant\n") and "Hi" in text
