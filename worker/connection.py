"""The worker's way to its coordinators: one channel per address, and the address it uses now.

A farm may run a standby coordinator next to the leader (`--coordinator a:1,b:2`). A call that finds
no serving coordinator at the current address (UNAVAILABLE, or a deadline) moves the agent on: to the
leader a standby named, else to the next address. Channels reconnect with a capped backoff
(protos.auth.CHANNEL_OPTIONS), so a coordinator back after an outage is found within seconds. Every
channel is TLS, its CA pinned by the join token's fingerprint.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading

import grpc

from protos import farm_pb2, farm_pb2_grpc
from protos.auth import JoinToken, auth_metadata, farm_channel
from protos.endpoints import Endpoints

log = logging.getLogger("farm.worker")

MOVE_ON = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
RPC_TIMEOUT_S = 30.0
RECONNECT_MAX_S = 2.0  # the agent's own retry backoff cap (grpc's reconnect backoff is capped alike)
RESULT_RETRY_S = 60.0  # how long a finished result is offered (across a coordinator failover)


class Coordinators:
    """Channels and stubs per coordinator address; `follow` after a failed call."""

    def __init__(self, addresses: str, token: str) -> None:
        self.endpoints = Endpoints(addresses)
        self._token = token  # its CA fingerprint pins every coordinator's certificate
        self.fingerprint = JoinToken.parse(token).fingerprint  # (the data channel's TLS pins it too)
        self._channels: dict[str, grpc.Channel] = {}
        self._stubs: dict[str, tuple[farm_pb2_grpc.FarmWorkerStub, farm_pb2_grpc.FarmBlobsStub]] = {}
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return self.endpoints.current

    def channel(self, address: str | None = None) -> grpc.Channel:
        address = address or self.address
        with self._lock:
            if address not in self._channels:
                channel = farm_channel(address, self._token)
                self._channels[address] = channel
                self._stubs[address] = (farm_pb2_grpc.FarmWorkerStub(channel), farm_pb2_grpc.FarmBlobsStub(channel))
            return self._channels[address]

    def worker(self) -> farm_pb2_grpc.FarmWorkerStub:
        address = self.address
        self.channel(address)
        return self._stubs[address][0]

    def blobs(self) -> farm_pb2_grpc.FarmBlobsStub:
        address = self.address
        self.channel(address)
        return self._stubs[address][1]

    def follow(self, exc: grpc.RpcError, address: str) -> bool:
        """After a call to `address` failed with exc: move on when no coordinator serves there.
        True when exc means "try again (elsewhere)", False for a real refusal."""
        if exc.code() not in MOVE_ON:
            return False
        moved = self.endpoints.move(address, exc.details())
        if moved != address:
            log.info("coordinator %s did not answer (%s); trying %s", address, exc.code().name, moved)
        return True

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()
            self._stubs.clear()


def default_worker_id() -> str:
    return socket.gethostname().split(".")[0]


def request_drain(coordinator: str, token: str, worker_id: str) -> int:
    """`farm worker --drain`: mark this Mac's worker draining on the farm, through the contract alone (a
    worker imports no client code). A standby's refusal names the leader, which is asked next."""
    request = farm_pb2.DrainRequest(worker_id=worker_id)
    endpoints, tried, errors = Endpoints(coordinator), set(), []
    address = endpoints.current
    while address not in tried:
        tried.add(address)
        channel = farm_channel(address, token)
        try:
            reply = farm_pb2_grpc.FarmClientStub(channel).DrainWorker(request, timeout=10,
                                                                      metadata=auth_metadata(token))
        except grpc.RpcError as exc:
            errors.append(f"{address}: {exc.details() or exc.code().name.lower()}")
            address = endpoints.move(address, exc.details())  # a standby names its leader
            continue
        finally:
            channel.close()
        print(f"{worker_id} {'draining' if reply.found else 'is not a registered worker'}")
        return 0 if reply.found else 1
    print(f"farm: no coordinator took the drain ({'; '.join(errors)})", file=sys.stderr)
    return 1
