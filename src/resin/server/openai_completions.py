"""POST /v1/completions: text or token-id prompts (one or a batch), echo + prompt logprobs.

lm-evaluation-harness scores multiple-choice tasks with `echo=true, logprobs=k,
max_tokens=0`: the answer is the prompt with each token's logprob; `max_tokens=0` still runs
one engine step (the engine always samples) and drops the generated token.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field
from starlette.responses import JSONResponse, Response

from resin.params import SamplingParams
from resin.recipe.deltas import TextDelta
from resin.server.asgi import SSEResponse, sse, until_disconnect
from resin.server.errors import ApiError
from resin.server.generation import Finish, Generation, TokenLogprob
from resin.server.intake import Batch
from resin.server.openai_chat import openai_stream_error, truncated, usage
from resin.server.schemas_openai import CompletionRequest as _Base
from resin.server.service import Service
from resin.server.structured import NONE, apply, name_field, openai_fields
from resin.server.text import PlainTextParser

router = APIRouter()
MAX_PROMPTS = 64


class CompletionRequest(_Base):
    max_tokens: int | None = Field(16, ge=0)


def prompt_count(body: CompletionRequest) -> int:
    """How many prompts `body.prompt` holds (known before tokenizing)."""
    p = body.prompt
    if isinstance(p, str) or (p and all(isinstance(x, int) for x in p)):
        return 1
    return len(p)


async def prompts_of(svc: Service, body: CompletionRequest) -> list[list[int]]:
    p = body.prompt
    texts: list[str] = []
    if isinstance(p, str):
        texts = [p]
    elif p and all(isinstance(x, int) for x in p):
        batch: list[list[int]] = [list(p)]  # type: ignore[arg-type]
    elif p and all(isinstance(x, str) for x in p):
        texts = list(p)  # type: ignore[arg-type]
    else:
        batch = [list(x) for x in p]  # type: ignore[arg-type]
    if texts:
        svc.check_length(sum(len(t) for t in texts), "prompt")
        batch = [await svc.encode(t, "prompt") for t in texts]
    if not batch or len(batch) > MAX_PROMPTS:
        raise ApiError(400, f"between 1 and {MAX_PROMPTS} prompts", "prompt")
    vocab = svc.tokenizer.vocab_size
    for ids in batch:
        if not ids:
            raise ApiError(400, "prompt is empty", "prompt")
        if any(t < 0 or t >= vocab for t in ids):
            raise ApiError(400, f"token ids must be in [0, {vocab})", "prompt")
    return batch


@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    svc: Service = request.app.state.service
    svc.check_model(body.model)
    stops = body.stop_strings()
    svc.check_stops(stops)
    if body.stream and body.echo and body.max_tokens == 0:
        raise ApiError(400, "max_tokens=0 needs stream=false", "max_tokens")
    if body.suffix:
        raise ApiError(400, "suffix is not supported", "suffix")
    count = prompt_count(body)
    if not 1 <= count <= MAX_PROMPTS:
        raise ApiError(400, f"between 1 and {MAX_PROMPTS} prompts", "prompt")
    with svc.reserve(body.n * count, request) as ticket:
        prompts = await prompts_of(svc, body)
        # Every prompt is checked before the first generation is submitted.
        fields, fmt = openai_fields(body), NONE
        per_prompt: list[list[SamplingParams]] = []
        for ids in prompts:
            params = svc.params(
                len(ids),
                max(1, body.max_tokens or 0) if body.max_tokens is not None else None,
                stop_token_ids=() if body.ignore_eos else svc.tokenizer.eos_token_ids,
                temperature=body.temperature,
                top_p=body.top_p,
                top_k=body.top_k,
                min_p=body.min_p,
                seed=body.seed,
                logprobs=body.logprobs,
                prompt_logprobs=body.logprobs if body.echo and body.logprobs is not None else None,
                min_tokens=body.min_tokens,
                ignore_eos=body.ignore_eos,
            )
            params, fmt = apply(params, fields, None, body.logit_bias)
            per_prompt.append(svc.choices(params, body.n))
        parser = lambda: PlainTextParser(svc.tokenizer, svc.tokenizer.eos_token_ids)  # noqa: E731
        submitted: list[Generation] = []
        for ids, choices in zip(prompts, per_prompt, strict=True):
            submitted += svc.submit(ticket, ids, choices, parser, stops)
        try:
            gens = await svc.start(submitted)
        except ApiError as exc:
            raise name_field(exc, fmt) from None
    rid = f"cmpl-{uuid.uuid4().hex}"
    prompt_ids = [ids for ids in prompts for _ in range(body.n)]
    drop = body.max_tokens == 0
    if body.stream:
        include = bool(body.stream_options and body.stream_options.include_usage)
        stream = _stream(svc, gens, rid, body, prompt_ids, include)
        return SSEResponse(stream, on_close=gens.cancel)
    result = await until_disconnect(request, _collect(svc, gens, rid, body, prompt_ids, drop))
    return JSONResponse(result)


def _logprobs(
    svc: Service,
    token_ids: Sequence[int],
    items: Sequence[TokenLogprob | None],
    offset: int,
) -> dict[str, Any]:
    tokens, lps, tops, offsets = [], [], [], []
    pos = offset
    for tid, item in zip(token_ids, items, strict=True):
        text = svc.token_text(tid)
        tokens.append(text)
        lps.append(None if item is None else item.logprob)
        tops.append(
            None
            if item is None
            else {svc.token_text(t.token_id): t.logprob for t in item.top} or None
        )
        offsets.append(pos)
        pos += len(text)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


async def _collect(
    svc: Service,
    gens: Batch,
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    drop_generated: bool,
) -> dict[str, Any]:
    texts = [""] * len(gens)
    ids: list[list[int]] = [[] for _ in gens]
    lps: list[list[TokenLogprob]] = [[] for _ in gens]
    plps: list[list[TokenLogprob] | None] = [None] * len(gens)
    finishes: list[Finish | None] = [None] * len(gens)
    async for i, up in gens.updates():
        texts[i] += "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
        ids[i] += up.token_ids
        lps[i] += up.logprobs
        plps[i] = up.prompt_logprobs or plps[i]
        finishes[i] = up.finish or finishes[i]
    done = [f for f in finishes if f is not None]
    if len(done) != len(gens):
        raise ApiError(503, "generation ended without a finish; retry")
    truncated(done)
    choices = []
    for i, f in enumerate(done):
        gen_ids, gen_lps, text = ids[i], list(lps[i]), texts[i]
        if drop_generated:
            gen_ids, gen_lps, text = [], [], ""
        logprobs = None
        if body.echo:
            prefix = svc.tokenizer.decode(prompts[i], False)
            text = prefix + text
        if body.logprobs is not None:
            all_ids: list[int] = list(gen_ids)
            items: list[TokenLogprob | None] = list(gen_lps) + [None] * (
                len(gen_ids) - len(gen_lps)
            )
            if body.echo:
                prompt_items: list[TokenLogprob | None] = [None]
                prompt_items += plps[i] or [None] * (len(prompts[i]) - 1)
                all_ids = prompts[i] + all_ids
                items = prompt_items[: len(prompts[i])] + items
            logprobs = _logprobs(svc, all_ids, items, 0)
        choices.append(
            {
                "index": i,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": f.reason,
            }
        )
    use = usage(done)
    use["prompt_tokens"] = sum(len(p) for p in prompts[:: max(1, body.n)])
    use["total_tokens"] = use["prompt_tokens"] + use["completion_tokens"]
    if drop_generated:
        use["completion_tokens"] = 0
        use["total_tokens"] = use["prompt_tokens"]
    return {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": svc.model,
        "choices": choices,
        "usage": use,
    }


async def _stream(
    svc: Service,
    gens: Batch,
    rid: str,
    body: CompletionRequest,
    prompts: list[list[int]],
    include_usage: bool,
) -> AsyncIterator[str]:
    base = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": svc.model}
    finishes: list[Finish] = []
    echoed = [not body.echo] * len(gens)
    offsets = [0] * len(gens)
    async for i, up in gens.updates():
        text = "".join(d.text for d in up.deltas if isinstance(d, TextDelta))
        if not echoed[i]:
            text = svc.tokenizer.decode(prompts[i], False) + text
            echoed[i] = True
        logprobs = None
        if body.logprobs is not None and up.logprobs:
            logprobs = _logprobs(svc, [x.token_id for x in up.logprobs], up.logprobs, offsets[i])
            offsets[i] += sum(len(t) for t in logprobs["tokens"])
        finish = None
        if up.finish is not None:
            finishes.append(up.finish)
            finish = up.finish.reason
            if finish in ("abort", "error"):
                yield openai_stream_error(up.finish)  # truncated: no [DONE]
                return
        choice = {"index": i, "text": text, "logprobs": logprobs, "finish_reason": finish}
        yield sse({**base, "choices": [choice]})
    if include_usage:
        yield sse({**base, "choices": [], "usage": usage(finishes)})
    yield sse("[DONE]")
