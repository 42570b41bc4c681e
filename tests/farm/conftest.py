"""The session's packs and references (tests/session_fixtures.py) for this folder's modules, and a
module's own store on the session's Redis."""

import pytest

from coordinator.state.redis_server import connect
from coordinator.state.store import FarmStore
from tests.session_fixtures import (  # noqa: F401 - fixtures, found by pytest
    local_reference,
    packs25,
    runner25,
    tiny25_pack,
    tiny_dev_pack,
)


@pytest.fixture(scope="module")
def mstore(redis_server):
    """The module's store (one farm per module), on the session's Redis emptied for it."""
    client = connect(redis_server.url)
    client.flushdb()
    yield FarmStore(client)
    client.close()
