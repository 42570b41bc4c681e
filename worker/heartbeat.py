"""The heartbeat thread beside a running task: it keeps the lease alive and carries step progress.

Its own module (the size rule): the agent starts one per task and reads `stop_reason` to learn that the
coordinator cancelled the task or gave its lease away (STALE); the beat also relays the drain mark.
It sees the agent only through `BeatOwner`, the few members it uses, so it imports no worker.agent.
"""

from __future__ import annotations

import logging
import threading
from typing import Protocol

import grpc

from protos import farm_pb2, farm_pb2_grpc
from protos.records import Progress
from worker import quiet
from worker.connection import RPC_TIMEOUT_S, Coordinators

log = logging.getLogger("farm.worker")


class BeatOwner(Protocol):
    """What a heartbeat reads of its agent (worker.agent.Agent): whom to beat, and where drain marks go."""

    worker_id: str
    coordinators: Coordinators
    metadata: list[tuple[str, str]]

    @property
    def address(self) -> str: ...

    @property
    def worker(self) -> farm_pb2_grpc.FarmWorkerStub: ...

    def drain(self, by_coordinator: bool = False) -> None: ...

    def resume(self) -> None: ...


class Heartbeat(threading.Thread):
    """Extends the lease every heartbeat_ms and carries progress; flags cancel/stale."""

    def __init__(self, agent: BeatOwner, lease: farm_pb2.LeaseReply, interval_s: float) -> None:
        super().__init__(name=f"heartbeat-{lease.task_id}", daemon=True)
        self.agent, self.lease, self.interval_s = agent, lease, interval_s
        self.progress = Progress()  # the agent replaces it as the task runs
        self.stop_reason: str | None = None
        self._done = threading.Event()

    def run(self) -> None:
        quiet.background()  # never take a core from the forward it beats for
        while not self._done.wait(self.interval_s):
            request = farm_pb2.HeartbeatRequest(
                task_id=self.lease.task_id,
                worker_id=self.agent.worker_id,
                fence=self.lease.fence,
                progress_json=self.progress.to_json(),
            )
            address = self.agent.address
            try:
                reply = self.agent.worker.Heartbeat(
                    request, timeout=RPC_TIMEOUT_S, metadata=self.agent.metadata
                )
            except grpc.RpcError as exc:  # coordinator away: keep working, the next beat may land
                log.warning("heartbeat for %s failed: %s", self.lease.task_id, exc.code())
                self.agent.coordinators.follow(exc, address)  # a standby named the leader: beat there
                continue
            if reply.drain:
                self.agent.drain(by_coordinator=True)
            else:
                self.agent.resume()  # the drain mark was lifted (the dashboard's resume) before we left
            if reply.status in (farm_pb2.CANCEL, farm_pb2.STALE):
                self.stop_reason = "cancelled" if reply.status == farm_pb2.CANCEL else "lease lost (stale)"
                log.info("task %s: %s", self.lease.task_id, self.stop_reason)
                return

    def finish(self) -> None:
        self._done.set()
        self.join(5)
