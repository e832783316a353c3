"""A BMC made of recorded Redfish responses (fixtures/redfish), served through httpx.MockTransport.

GETs answer the recorded JSON; the writes a mount needs (InsertMedia/EjectMedia, OEM HPE actions,
PATCH of a slot or of Boot, ComputerSystem.Reset) change the in-memory copy so the driver's read-back
sees what a BMC would report. Anything not recorded is a 404 with a Redfish error body.

``requests`` lists every request (method, path); ``sessions=True`` adds a SessionService (an
X-Auth-Token per login, :meth:`end_sessions` makes the BMC forget them: 401 until a new login);
``insert_status`` is the answer to InsertMedia (204, or 202 for a BMC that runs it as a task).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import httpx

FIXTURES = Path(__file__).parent / "fixtures" / "redfish"


def _err(status: int, message_id: str, message: str) -> httpx.Response:
    return httpx.Response(
        status,
        json={
            "error": {
                "code": message_id,
                "message": message,
                "@Message.ExtendedInfo": [{"MessageId": message_id, "Message": message}],
            }
        },
    )


class FakeBmc:
    def __init__(
        self,
        fixture_dir: str,
        *,
        reject_params: frozenset[str] = frozenset(),
        sessions: bool = False,
        insert_status: int = 204,
    ) -> None:
        self.dir = FIXTURES / fixture_dir
        self.docs: dict[str, dict] = {}
        for f in self.dir.glob("redfish__v1*.json"):
            name = f.name[:-5]
            if "--" in name:
                continue
            self.docs["/" + name.replace("__", "/")] = json.loads(f.read_text())
        self.reject_params = reject_params
        self.report_image: str | None = None  # a BMC that reports another image than inserted
        self.writes: list[tuple[str, str, dict]] = []
        self.requests: list[tuple[str, str]] = []
        self.sessions = sessions
        self.tokens: set[str] = set()
        self.logins = 0
        self.keep_sessions = True  # False: a login answers, but its token is forgotten at once
        self.insert_status = insert_status

    def end_sessions(self) -> None:
        self.tokens.clear()

    def gets(self, path: str) -> int:
        return self.requests.count(("GET", self.key(path)))

    @staticmethod
    def key(path: str) -> str:
        return path.rstrip("/") or "/"

    def doc(self, path: str) -> dict | None:
        return self.docs.get(self.key(path))

    def slots(self) -> dict[str, dict]:
        return {p: d for p, d in self.docs.items() if "MediaTypes" in d}

    def cd_slot_with(self, image: str) -> dict | None:
        return next((d for d in self.slots().values() if d.get("Image") == image), None)

    def insert_into(self, path: str, image: str) -> None:
        slot = self.doc(path)
        assert slot is not None
        slot.update({"Image": image, "Inserted": True, "ConnectedVia": "URI"})

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, method = self.key(request.url.path), request.method
        body = json.loads(request.content) if request.content else {}
        self.requests.append((method, path))
        if method != "GET":
            self.writes.append((method, path, copy.deepcopy(body)))
        if self.sessions and method == "POST" and path.endswith("/SessionService/Sessions"):
            self.logins += 1
            token = f"tok-{self.logins}"
            if self.keep_sessions:
                self.tokens.add(token)
            headers = {
                "X-Auth-Token": token,
                "Location": f"/redfish/v1/SessionService/Sessions/{self.logins}",
            }
            return httpx.Response(201, headers=headers, json={})
        if self.sessions and path != "/redfish/v1" and request.headers.get("X-Auth-Token") not in self.tokens:
            return _err(401, "Base.1.0.NoValidSession", "no valid session")
        if method == "DELETE" and "/SessionService/Sessions/" in path:
            self.tokens.discard(request.headers.get("X-Auth-Token", ""))
            return httpx.Response(204)
        if method == "GET":
            d = self.doc(path)
            return (
                httpx.Response(200, json=d)
                if d is not None
                else _err(404, "Base.1.0.ResourceMissingAtURI", path)
            )
        if method == "POST" and path.endswith("/SessionService/Sessions"):
            return _err(404, "Base.1.0.ResourceMissingAtURI", path)
        if "/Actions/" in path:
            owner, action = path.split("/Actions/", 1)
            owner_doc = self.doc(owner)
            if owner_doc is None:
                return _err(404, "Base.1.0.ResourceMissingAtURI", path)
            if action.endswith("InsertMedia") or action.endswith("InsertVirtualMedia"):
                bad = set(body) & self.reject_params
                if bad:
                    return _err(
                        400, "Base.1.4.PropertyUnknown", f"The property {sorted(bad)[0]} is not valid"
                    )
                image = self.report_image or body["Image"]
                owner_doc.update({"Image": image, "Inserted": True, "ConnectedVia": "URI"})
                return httpx.Response(self.insert_status)
            elif action.endswith("EjectMedia") or action.endswith("EjectVirtualMedia"):
                owner_doc.update({"Image": None, "Inserted": False, "ConnectedVia": "NotConnected"})
            elif action.endswith("ComputerSystem.Reset"):
                owner_doc["PowerState"] = "On" if body.get("ResetType") != "ForceOff" else "Off"
            return httpx.Response(204)
        if method == "PATCH":
            d = self.doc(path)
            if d is None:
                return _err(404, "Base.1.0.ResourceMissingAtURI", path)
            if "Boot" in body:
                boot = d.setdefault("Boot", {})
                allowed = boot.get("BootSourceOverrideEnabled@Redfish.AllowableValues")
                if allowed and body["Boot"].get("BootSourceOverrideEnabled") not in (None, *allowed):
                    return _err(400, "Base.1.4.PropertyValueNotInList", "BootSourceOverrideEnabled")
                boot.update(body["Boot"])
            else:
                d.update(body)
                if self.report_image and body.get("Image"):
                    d["Image"] = self.report_image
            return httpx.Response(204)
        return _err(405, "Base.1.0.ActionNotSupported", path)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)
