"""The one error type of the client verbs (re-exported by :mod:`karios.cli.client.api`)."""

from __future__ import annotations

from typing import Any


class CliError(Exception):
    """An error to print as ``karios: <message>`` and exit with ``code``. An HTTP error answer
    keeps its status and JSON body (``body``: the gateway's ``code``, ``field``, ``details``) for
    a verb that has more to say about it (``karios fabric set`` on a switch ack)."""

    def __init__(self, message: str, code: int = 1, *, status: int = 0, body: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status
        self.body = body
