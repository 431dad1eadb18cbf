"""Images through the real server: a tiny random-weight Gemma 3 vision checkpoint (with the
real Gemma 3 tokenizer and template) loaded like `resin serve` does, driven over HTTP by the
openai and anthropic SDKs; bad images are 400s and the server stays healthy; a text-only
model refuses images with a 400; the same image again is a prefix-cache hit. `resin serve`
itself (its default: the image decoded in a frontend process, its pixels sent to the engine
process) answers the same way."""

from __future__ import annotations

import base64
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import numpy as np
import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("PIL")

from resin.server import HttpServer
from resin.server.launch import free_port, running
from tests.media.images import encode, png_header_only
from tests.recipe.assets import npm_dir, npm_tokenizer

MODEL = "tiny-gemma3-vision"


def _checkpoint(folder: Path) -> None:
    import torch
    import transformers

    npm_tokenizer("gemma3")  # skips when the tokenizer is not fetched
    text = dict(
        vocab_size=262208, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, num_hidden_layers=2, head_dim=16, sliding_window=512,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=16,
        max_position_embeddings=4096,
    )  # fmt: skip
    vision = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=896, patch_size=56, vision_use_head=False,
    )  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=256,
        image_token_index=262144, boi_token_index=255999, eoi_token_index=256000,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.Gemma3ForConditionalGeneration(config).eval().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(npm_dir("gemma3") / name, folder / name)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    made = tmp_path_factory.mktemp("gemma3-vision")
    _checkpoint(made)
    return made


@pytest.fixture(scope="module")
def url(folder: Path) -> Iterator[str]:
    from resin_app.loading import LoadOptions, load

    loaded = load(LoadOptions(checkpoint=str(folder), context_length=1024), progress=False)
    assert loaded.recipe.supports_images
    server = HttpServer(
        loaded.engine,
        loaded.recipe,
        tokenizer=loaded.tokenizer,
        model=MODEL,
        port=free_port(),
        context_length=loaded.context_length,
    )
    with running(server) as base:
        yield base
    loaded.engine.close()


def _png(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (40, 60, 3), dtype=np.uint8)
    return encode(pixels, "RGB")


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _chat(image_url: str) -> list[dict[str, object]]:
    return [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": image_url}},
                {"type": "text", "text": "What is in this picture?"},
            ],
        }
    ]


def test_openai_sdk_image_round_trip_and_prefix_hit(url: str) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=120)
    kwargs = {"model": MODEL, "max_tokens": 4, "temperature": 0}
    first = client.chat.completions.create(messages=_chat(_data_url(_png(1))), **kwargs)  # type: ignore[call-overload]
    assert first.usage.prompt_tokens > 256 and first.usage.completion_tokens == 4
    assert isinstance(first.choices[0].message.content, str)
    again = client.chat.completions.create(messages=_chat(_data_url(_png(1))), **kwargs)  # type: ignore[call-overload]
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 256  # shared past the image
    other = client.chat.completions.create(messages=_chat(_data_url(_png(2))), **kwargs)  # type: ignore[call-overload]
    assert other.usage.prompt_tokens_details.cached_tokens < 32  # only the text before it


def test_anthropic_sdk_image_block(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x", max_retries=0, timeout=120)
    source = {
        "type": "base64",
        "media_type": "image/png",
        "data": base64.b64encode(_png(3)).decode(),
    }
    reply = client.messages.create(
        model=MODEL,
        max_tokens=3,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image", "source": source},  # type: ignore[typeddict-item]
                    {"type": "text", "text": "Describe it."},
                ],
            }
        ],
    )
    assert reply.usage.input_tokens > 256 and reply.usage.output_tokens == 3


@pytest.mark.parametrize(
    ("image_url", "message"),
    [
        (_data_url(_png(4)[:300]), "cannot decode"),  # truncated PNG
        (_data_url(png_header_only(50_000, 50_000)), "50000x50000|too large"),
        (_data_url(_png(5), "image/jpeg"), "not the declared image/jpeg"),
        (_data_url(b'<svg xmlns="http://www.w3.org/2000/svg"/>', "image/svg+xml"), "SVG"),
        ("https://example.com/cat.png", "no network"),
        ("data:image/png;base64,%%%", "base64"),
    ],
    ids=["truncated", "bomb", "wrong-mime", "svg", "remote", "bad-base64"],
)
def test_bad_images_are_400_and_server_stays_healthy(
    url: str, image_url: str, message: str
) -> None:
    body = {"model": MODEL, "max_tokens": 2, "messages": _chat(image_url)}
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert re.search(message, response.json()["error"]["message"])
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_too_many_images_and_anthropic_url_source(url: str) -> None:
    image = {"type": "image_url", "image_url": {"url": _data_url(_png(6))}}
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "user", "content": [image] * 17}],
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and "limit is 16" in response.text
    block = {"type": "image", "source": {"type": "url", "url": "https://example.com/x.png"}}
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": [block]}]}
    response = httpx.post(url + "/v1/messages", json=body, timeout=60)
    assert response.status_code == 400 and "no URL fetches" in response.text


def test_text_only_model_refuses_images() -> None:
    from tests.server.conftest import MODEL as TEXT_MODEL
    from tests.server.conftest import make_server

    with running(make_server()) as base:
        body = {"model": TEXT_MODEL, "max_tokens": 2, "messages": _chat(_data_url(_png(7)))}
        response = httpx.post(base + "/v1/chat/completions", json=body, timeout=30)
        assert response.status_code == 400
        assert "does not take images" in response.json()["error"]["message"]
        assert httpx.get(base + "/health", timeout=10).status_code == 200


def test_image_bytes_are_checked_in_the_pixel_path(url: str) -> None:
    """A JPEG cut after its header passes the header check, then fails to decode: a 400."""
    pixels = np.random.default_rng(8).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    jpeg = encode(pixels, "RGB", "JPEG")
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": _chat(_data_url(jpeg[:1500], "image/jpeg")),
    }
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    assert "cannot render" in response.json()["error"]["message"]
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_chat_page_sends_a_pasted_image(url: str) -> None:
    import os

    from tests.server.test_chat_page import CHROMIUM, FLAGS

    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium")
    from playwright.sync_api import sync_playwright

    png = base64.b64encode(_png(9)).decode()
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS, headless=True)
        page = browser.new_page(bypass_csp=True)  # wait_for_function evaluates strings
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url + "/")
        page.wait_for_function(f"document.getElementById('model').textContent === '{MODEL}'")
        page.evaluate(
            """(b64) => {
                const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
                const data = new DataTransfer();
                data.items.add(new File([bytes], "x.png", { type: "image/png" }));
                const ev = new ClipboardEvent("paste", { clipboardData: data, bubbles: true });
                document.getElementById("prompt").dispatchEvent(ev);
            }""",
            png,
        )
        page.wait_for_selector("#attachments img.thumb")
        page.fill("#max-tokens", "2")
        page.fill("#prompt", "What is this?")
        page.keyboard.press("Enter")
        page.wait_for_function(
            "document.querySelector('.msg.assistant .stats')?.textContent.includes('tok/s')"
            " && document.querySelector('#send').hidden === false"
        )
        stats = page.locator(".msg.assistant .stats").inner_text()
        assert int(stats.split(" prompt tokens")[0]) > 256  # the image's placeholders counted
        assert page.locator(".msg.user img.thumb").count() == 1
        assert page.locator("#attachments img").count() == 0  # sent, then cleared
        assert page.locator(".msg.assistant .error").count() == 0
        assert not errors, errors
        browser.close()


def test_images_through_resin_serve_and_its_engine_process(folder: Path, tmp_path: Path) -> None:
    from tests.server.test_hostile_clients import serve

    with serve(tmp_path / "serve.log", "--checkpoint", str(folder), "--context-length", "1024",
               "--disable-log-requests") as served:  # fmt: skip
        assert "1 engine process" in served.log.read_text()
        body = {"messages": _chat(_data_url(_png(1))), "max_tokens": 3}
        first, again = (httpx.post(served.url + "/v1/chat/completions", json=body, timeout=120)
                        for _ in range(2))  # fmt: skip
        assert first.status_code == again.status_code == 200, first.text
        assert first.json()["usage"]["prompt_tokens"] > 256  # the image's 256 tokens and text
        assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 256
        bad = {"messages": _chat(_data_url(b"not a png")), "max_tokens": 3}
        refused = httpx.post(served.url + "/v1/chat/completions", json=bad, timeout=60)
        assert refused.status_code == 400 and "bad image" in refused.json()["error"]["message"]
