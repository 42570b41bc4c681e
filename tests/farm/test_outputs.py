"""Outputs go to the client, not to client-chosen paths: a spec's `exr` (relative with `..`, or
absolute) makes the coordinator write EXR frames only into its own render folder, and FetchOutput
serves only the coordinator's own file names. Real farm: Redis, TLS gRPC, a worker process."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from farm_cli.client import FarmError
from tests.farm.farm_harness import farm, wait_done

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5}


@pytest.mark.timeout(300)
def test_exr_paths_from_a_spec_are_never_opened_and_the_client_fetches_the_frames(store, tmp_data, tiny_packs,
                                                                                   tmp_path: Path) -> None:
    absolute = tmp_path / "abs-exr"
    escapes = {"../../../escape-exr": tmp_data.parent / "escape-exr", str(absolute): absolute}
    with farm(store, tmp_data, tiny_packs, workers=1) as (client, _):
        ids = [client.submit({**SPEC, "exr": value}) for value in escapes]
        for render_id in ids:
            wait_done(client, render_id)
        for render_id in ids:
            folder = tmp_data / "renders" / render_id / "exr"
            assert len(list(folder.glob("frame_*.exr"))) == 9 and (folder / "render.json").is_file()
            mine = tmp_path / "mine" / render_id
            assert client.fetch_exr(render_id, mine) == 9
            assert sorted(p.name for p in mine.iterdir())[:2] == ["frame_00000.exr", "frame_00001.exr"]
            assert (mine / "frame_00008.exr").read_bytes() == (folder / "frame_00008.exr").read_bytes()
        for path in escapes.values():
            assert not path.exists(), path
        for name in ("../../token", "/etc/passwd", "exr/../../../token", "tls/ca.key", "exr/frame_1.exr"):
            with pytest.raises(FarmError) as refused:
                client.fetch_output(ids[0], tmp_path / "x", file=name)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and "\n" not in str(refused.value)
        plain = client.submit(SPEC)
        wait_done(client, plain)
        with pytest.raises(FarmError) as none:
            client.fetch_exr(plain, tmp_path / "none")
        assert none.value.code == grpc.StatusCode.NOT_FOUND
