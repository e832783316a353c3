"""The event stream's size limit is a setting, and a NATS server too small for it is an error
naming that setting (what a service logs at start against a configured NATS; ``karios up`` with
its embedded NATS refuses earlier, see tests/e2e/test_embedded_restart.py).

A nats-server of our own on a 128 MiB tmpfs (root only): JetStream takes 75 % of it (96 MiB), so
the default 1 GiB event stream is refused — :class:`StorageUnavailable` naming
KARIOS_BUS_EVENTS_MAX_BYTES — and the same streams with the limit lowered to 48 MiB are created.
"""

from __future__ import annotations

import nats
import pytest

from karios.common.bus.streams import StorageUnavailable, ensure_streams
from karios.common.bus.subjects import Subjects
from tests.fixtures.chaos import PrivateNats, small_tmpfs

pytestmark = pytest.mark.integration

MIB = 1 << 20


async def test_an_event_stream_larger_than_the_store_names_the_setting_and_a_lower_limit_fits():
    with small_tmpfs("128m") as root:
        server = PrivateNats(root)
        server.start()
        nc = await nats.connect(server.url)
        try:
            js, subjects = nc.jetstream(), Subjects("space")
            with pytest.raises(StorageUnavailable, match="lower KARIOS_BUS_EVENTS_MAX_BYTES"):
                await ensure_streams(js, subjects)
            await ensure_streams(js, subjects, events_max_bytes=48 * MIB)
            assert (await js.stream_info(subjects.evt_stream)).config.max_bytes == 48 * MIB
        finally:
            await nc.close()
            server.stop()
