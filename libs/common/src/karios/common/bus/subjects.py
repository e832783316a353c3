"""Every NATS subject and stream name, built here and nowhere else.

Families (``<p>`` is the bus prefix, ``karios`` by default):

- ``<p>.cmd.<domain>.<verb>``              commands, JetStream work queue ``<P>_CMD``
- ``<p>.evt.<domain>.<fact>.<entity>``     events, JetStream ``<P>_EVT``
- ``<p>.q.<domain>.<what>``                queries, core NATS request/reply
- ``<p>.req.<domain>.<verb>``              synchronous commands (request/reply, idempotent by key)
- ``<p>.bcast.<domain>.<what>``            core NATS fan-out to every replica (e.g. cancel an apply)
- ``<p>.dlq.<original subject tail>``      dead letters, JetStream ``<P>_DLQ``

Entities such as IP addresses contain dots, which NATS treats as token separators, so
:func:`token` encodes them (``10.0.0.1`` → ``10_0_0_1``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-:]")


def token(value: str) -> str:
    """Encode one value as a single subject token (dots, spaces, wildcards replaced)."""
    if not value:
        return "_"
    return _UNSAFE.sub("_", value)


@dataclass(frozen=True)
class Subjects:
    prefix: str = "karios"

    # -- streams ---------------------------------------------------------------
    @property
    def cmd_stream(self) -> str:
        return f"{self.prefix.upper()}_CMD"

    @property
    def evt_stream(self) -> str:
        return f"{self.prefix.upper()}_EVT"

    @property
    def dlq_stream(self) -> str:
        return f"{self.prefix.upper()}_DLQ"

    # -- wildcards -------------------------------------------------------------
    @property
    def all_commands(self) -> str:
        return f"{self.prefix}.cmd.>"

    @property
    def all_events(self) -> str:
        return f"{self.prefix}.evt.>"

    @property
    def all_dead_letters(self) -> str:
        return f"{self.prefix}.dlq.>"

    def commands_of(self, domain: str) -> str:
        return f"{self.prefix}.cmd.{token(domain)}.>"

    def events_of(self, domain: str) -> str:
        return f"{self.prefix}.evt.{token(domain)}.>"

    def events_of_fact(self, domain: str, fact: str) -> str:
        """Every entity's ``fact`` events of ``domain`` (``<p>.evt.<domain>.<fact>.*``)."""
        return f"{self.prefix}.evt.{token(domain)}.{fact}.*"

    # -- concrete subjects -----------------------------------------------------
    def cmd(self, domain: str, verb: str) -> str:
        return f"{self.prefix}.cmd.{token(domain)}.{token(verb)}"

    def evt(self, domain: str, fact: str, entity: str) -> str:
        return f"{self.prefix}.evt.{token(domain)}.{fact}.{token(entity)}"

    def query(self, domain: str, what: str) -> str:
        return f"{self.prefix}.q.{token(domain)}.{what}"

    def request(self, domain: str, verb: str) -> str:
        return f"{self.prefix}.req.{token(domain)}.{verb}"

    def broadcast(self, domain: str, what: str) -> str:
        """``<p>.bcast.<domain>.<what>``: core NATS heard by every replica (no queue group, no stream)."""
        return f"{self.prefix}.bcast.{token(domain)}.{token(what)}"

    def dlq(self, original_subject: str) -> str:
        tail = original_subject.split(".", 1)[1] if "." in original_subject else original_subject
        return f"{self.prefix}.dlq.{tail}"

    def parse_event(self, subject: str) -> tuple[str, str, str]:
        """``<p>.evt.<domain>.<fact...>.<entity>`` → (domain, fact, entity token)."""
        parts = subject.split(".")
        if len(parts) < 5 or parts[0] != self.prefix or parts[1] != "evt":
            raise ValueError(f"not an event subject: {subject}")
        return parts[2], ".".join(parts[3:-1]), parts[-1]


DEFAULT = Subjects()
