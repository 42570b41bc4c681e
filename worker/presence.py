"""The worker's presence: an Attach stream held open to the coordinator for the agent's whole life.

When the agent process dies (kill -9, a crash, a Mac that powers off) the kernel closes its socket and
the coordinator sees the stream break at once, so the worker's leases go back to the queue in well under
a second instead of at their deadline. A worker frozen or cut off without a reset keeps its stream until
HTTP/2 keepalive gives up on it (the coordinator's ping goes unanswered: about 7 s at most, protos/auth.py). The stream is reopened (capped backoff) when
the coordinator restarts or another one leads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from protos import farm_pb2, farm_pb2_grpc
from protos.retry import Backoff, Outage
from worker import quiet

log = logging.getLogger("farm.worker")


class Presence(threading.Thread):
    """Keeps one Attach stream open (to whichever coordinator `stub()` names now) until stop()."""

    def __init__(self, stub: Callable[[], farm_pb2_grpc.FarmWorkerStub], worker_id: str, session: str,
                 metadata: tuple, max_backoff_s: float = 2.0) -> None:
        super().__init__(name="farm-presence", daemon=True)
        self.stub, self.worker_id, self.session, self.metadata = stub, worker_id, session, metadata
        self.max_backoff_s = max_backoff_s
        self.attached = threading.Event()  # set while the coordinator has acknowledged the stream
        self._stopping = threading.Event()
        self._call: grpc.Call | None = None

    def run(self) -> None:
        quiet.background()  # an idle stream: never take a core from a forward
        outage, backoff = Outage("presence stream", log), Backoff(first_s=0.2, max_s=self.max_backoff_s)
        request = farm_pb2.AttachRequest(worker_id=self.worker_id, session=self.session)
        while not self._stopping.is_set():
            try:
                self._call = self.stub().Attach(request, metadata=self.metadata)
                for _ack in self._call:
                    self.attached.set()
                    outage.ok()
                    backoff.reset()
            except grpc.RpcError as exc:
                if not self._stopping.is_set():
                    outage.failed(exc)
            self.attached.clear()
            self._stopping.wait(backoff.delay())

    def stop(self) -> None:
        self._stopping.set()
        call = self._call
        if call is not None:
            call.cancel()
