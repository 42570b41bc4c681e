"""The session's packs and references (tests/session_fixtures.py) for this folder's modules."""

from tests.session_fixtures import (  # noqa: F401 - fixtures, found by pytest
    local_reference,
    packs25,
    runner25,
    tiny25_pack,
    tiny_dev_pack,
)
