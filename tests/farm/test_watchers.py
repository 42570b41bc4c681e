"""80 concurrent watchers cannot stop the farm: the coordinator relays at most max_workers/4 Watch
streams (a thread each), refuses the rest with RESOURCE_EXHAUSTED (those clients poll), and worker
RPCs keep answering at once; a render started afterwards finishes and every watcher sees it end."""

from __future__ import annotations

import statistics
import threading
import time

import grpc
import pytest

from coordinator.auth import auth_metadata
from farm_cli.client import FarmClient
from protos import farm_pb2, farm_pb2_grpc
from protos.auth import farm_channel
from tests.farm.farm_harness import farm, start_worker

SPEC = {"prompt": "a fox", "height": 128, "width": 128, "frames": 9, "frame_rate": 24.0, "seed": 5}
WATCHERS = 80


@pytest.mark.timeout(300)
def test_eighty_watchers_leave_worker_rpcs_free_and_all_see_the_render_end(store, tmp_data, tiny_packs) -> None:
    with farm(store, tmp_data, tiny_packs, workers=0) as (client, _):
        address, token = client.address, (tmp_data / "token").read_text().strip()
        render_id = client.submit(SPEC)
        clients = [FarmClient(address, token, timeout=30) for _ in range(8)]
        for c in clients:
            c.list()  # channels up before the crowd
        ended: list[str] = []

        def watch(c: FarmClient) -> None:
            for _event in c.watch(render_id, timeout=240):
                pass
            ended.append(c.get(render_id)["state"])

        threads = [threading.Thread(target=watch, args=(clients[i % 8],), daemon=True) for i in range(WATCHERS)]
        for t in threads:
            t.start()
        time.sleep(3)  # every watcher has asked by now: 64 relayed, the rest polling
        with farm_channel(address, token) as channel:
            md = auth_metadata(token)
            with pytest.raises(grpc.RpcError) as refused:
                list(farm_pb2_grpc.FarmClientStub(channel).Watch(
                    farm_pb2.WatchRequest(render_id=render_id), timeout=5, metadata=md))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "\n" not in refused.value.details()
            worker = farm_pb2_grpc.FarmWorkerStub(channel)
            seconds = []
            for _ in range(20):
                start = time.perf_counter()
                worker.Heartbeat(farm_pb2.HeartbeatRequest(task_id=f"{render_id}.stage1", worker_id="probe", fence=1),
                                 timeout=5, metadata=md)
                seconds.append(time.perf_counter() - start)
        print(f"worker RPC under {WATCHERS} watchers: median {statistics.median(seconds) * 1e3:.1f} ms, "
              f"max {max(seconds) * 1e3:.1f} ms")
        assert max(seconds) < 2.0
        proc = start_worker(address, token, tiny_packs, "late", tmp_data)
        try:
            for t in threads:
                t.join(timeout=240)
            assert len(ended) == WATCHERS and set(ended) == {"done"}, (len(ended), set(ended))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            for c in clients:
                c.close()
