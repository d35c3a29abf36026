"""GET /api/health: public, no database (a load balancer's probe)."""

from __future__ import annotations

from fastapi import APIRouter

from ampscope_server.api.schemas import Health

router = APIRouter(prefix="/api", tags=["health"])


@router.get("/health")
def get_health() -> Health:
    return Health()
