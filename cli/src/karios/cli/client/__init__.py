"""The ``karios`` client verbs: they talk to the gateway's REST API and SSE stream, never to the
database (``context`` where the gateway is and the token, ``api`` errors a person can read,
``sse`` the event stream with resume, ``watch`` live progress, ``commands`` the verbs)."""
