"""Fair share on a real farm: two submitters queue 4 renders each at equal weight, one after the other;
the renders finish interleaved, not the first submitter's four before the second's (completion order)."""

from __future__ import annotations

import pytest

from tests.farm.farm_harness import farm, wait_done

SPEC = {"prompt": "a paper boat on a pond", "height": 256, "width": 384, "frames": 9, "frame_rate": 24.0,
        "pack": "tiny", "audio": False}


def _imbalance(order: list[str]) -> int:
    """The largest lead one submitter has over the other in any prefix of the order."""
    lead, worst = 0, 0
    for who in order:
        lead += 1 if who == "ann" else -1
        worst = max(worst, abs(lead))
    return worst


@pytest.mark.timeout(600)
def test_two_submitters_finish_interleaved(store, tmp_data, tiny_packs):
    with farm(store, tmp_data, tiny_packs, workers=2) as (client, _procs):
        ids = [client.submit({**SPEC, "seed": i, "submitter": who}) for who in ("ann", "bob") for i in range(1, 5)]
        renders = [wait_done(client, rid, timeout=500) for rid in ids]
    order = [r["spec"]["submitter"] for r in sorted(renders, key=lambda r: (r["finished_ms"], r["id"]))]
    print("completion order:", " ".join(order))
    assert order.count("ann") == order.count("bob") == 4
    assert _imbalance(order) <= 2, order  # FIFO alone finishes ann's four first (a lead of 4)
