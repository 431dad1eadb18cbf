"""GET /v1/models, /health, /metrics and the chat page at `/` (with its icon)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from starlette.responses import FileResponse, JSONResponse, Response

from resin.server.service import Service

router = APIRouter()
STATIC = Path(__file__).parent / "static"


def _card(svc: Service) -> dict[str, object]:
    """The model card. `capabilities` says what the recipe can do (`resin check` holds the
    model to it): call tools, produce reasoning, take images."""
    return {
        "id": svc.model,
        "object": "model",
        "created": svc.started,
        "owned_by": "resin",
        "max_model_len": svc.context_length,
        "capabilities": {
            "tools": bool(svc.recipe.supports_tools),
            "reasoning": bool(svc.recipe.supports_reasoning),
            "vision": bool(svc.recipe.supports_images),
        },
        "generation_defaults": svc.defaults.as_dict(),
    }


@router.get("/v1/models")
async def models(request: Request) -> JSONResponse:
    svc: Service = request.app.state.service
    return JSONResponse({"object": "list", "data": [_card(svc)]})


@router.get("/v1/models/{model_id:path}")
async def model(model_id: str, request: Request) -> JSONResponse:
    svc: Service = request.app.state.service
    svc.check_model(model_id)
    return JSONResponse(_card(svc))


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while the engine actor lives (every replica's, with data parallelism); 503 once one
    died ("degraded" while others still serve) or the server is stopping, and 503 `stalled`
    while an engine has made no progress for more than `stall_timeout_s` with work queued or
    running (a stopped engine process, a step that never returns)."""
    svc: Service = request.app.state.service
    actors = svc.actor.replicas
    ok = svc.actor.alive
    status = "ok" if ok else "degraded" if any(a.alive for a in actors) else "unavailable"
    body: dict[str, object] = {"status": status, "queued": svc.actor.queued}
    if svc.actor.error:
        body["error"] = svc.actor.error
    stalled = max((a.stalled_for() for a in actors), default=0.0)
    if ok and stalled > svc.limits.stall_timeout_s:
        ok, body["status"] = False, "stalled"
        body["error"] = (
            f"the engine made no progress for {stalled:.0f} s with work queued "
            f"(bound {svc.limits.stall_timeout_s:g} s, --stall-timeout)"
        )
    if len(actors) > 1:
        body["replicas"] = [{"alive": a.alive, "load": a.load} for a in actors]
    return JSONResponse(body, 200 if ok else 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    svc: Service = request.app.state.service
    return Response(svc.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers=_PAGE_HEADERS)


@router.get("/favicon.ico", include_in_schema=False)
async def favicon() -> FileResponse:
    """The page links its icon; browsers that ask for /favicon.ico anyway get it too."""
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


# The page only loads its own scripts: a reply that smuggles in a <script> or an inline
# event handler cannot run even if the renderer missed it.
_PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
        "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; object-src 'none'; "
        "base-uri 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
}
