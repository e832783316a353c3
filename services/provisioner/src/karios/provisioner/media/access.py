"""Who may fetch a job's medium: a signed, unexpired URL (:mod:`.signing`) of a job that still
consumes its medium (from ``building_media`` until it ends; ``stuck`` included, since the
installer may come back). The signature is checked first, so an unsigned request never reaches
the database; the job's state is cached for ``ttl`` seconds (a BMC reads its medium in many range
requests) and dropped at once when this replica ends the job.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable

from karios.common.cache import SingleFlightCache
from karios.provisioner.media.signing import MediaJobEnded, MediaUrlSigner
from karios.provisioner.statemachine import State

MEDIA_STATES = frozenset(
    {State.building_media, State.mounting, State.booting, State.installing, State.first_boot, State.stuck}
)


class MediaAccess:
    def __init__(
        self,
        signer: MediaUrlSigner,
        state_of: Callable[[str], Awaitable[str | None]],
        *,
        ttl: float = 2.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.signer = signer
        self._state_of = state_of
        self._clock = clock
        self._states: SingleFlightCache[str] = SingleFlightCache(ttl=ttl, negative_ttl=ttl)

    def url(self, base_url: str, job_id: str, lifetime: float) -> str:
        """The signed URL the BMC gets, good for ``lifetime`` seconds (the stage deadline)."""
        return self.signer.url(base_url, job_id, math.ceil(self._clock() + lifetime))

    async def admit(self, job_id: str, expires: str | None, signature: str | None) -> None:
        """Return if the request may have the medium; else 403 with the reason's code."""
        self.signer.verify(job_id, expires, signature, now=self._clock())
        state = (await self._states.get_or_load(job_id, lambda: self._state_of(job_id))).value
        if state not in MEDIA_STATES:
            raise MediaJobEnded("media URL: the job has ended; its medium is no longer served")

    def forget(self, job_id: str) -> None:
        """The job ended here: the next request reads its state again."""
        self._states.invalidate([job_id], negatives=False)
