"""The web console: server-rendered pages under ``/console`` (see docs/console.md)."""

from karios.api_gateway.console.pages import router

__all__ = ["router"]
