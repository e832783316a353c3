"""``/console/…``: the web console (HTML, not part of the OpenAPI document); see docs/console.md."""

from karios.api_gateway.console import router

__all__ = ["router"]
