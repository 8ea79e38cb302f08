"""Serves the admin page's static files. They hold no data: every number the page shows
comes from `/admin/timeline`, `/admin/gmg` (admin key) and `/metrics`."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from starlette.responses import FileResponse, Response

from gateway.errors import ApiError

router = APIRouter()

STATIC = Path(__file__).parent / "static"
_ASSETS = {"ui.js": "text/javascript", "ui.css": "text/css", "charts.js": "text/javascript"}


@router.get("/admin/ui")
async def admin_page() -> Response:
    return FileResponse(STATIC / "index.html", media_type="text/html",
                        headers={"cache-control": "no-cache"})


@router.get("/admin/ui/{name}")
async def admin_asset(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        raise ApiError(404, f"No such file: {name[:64]!r}.", code="not_found")
    return FileResponse(STATIC / name, media_type=media_type,
                        headers={"cache-control": "no-cache"})
