"""A task's tensors on the wire: inputs fetched (cached by sha256, several at once), outputs uploaded.

Its own module (the size rule): the agent's lease loop needs only "these shas as arrays" and "these
encoded outputs as shas". Both directions follow the leader through a coordinator failover and give up
after a bounded time, so a task fails visibly instead of hanging until its lease expires.

Bytes go over the coordinator's bulk data channel (protos/bulkclient.py over protos/bulkwire.py) when its registration announced
one, else over the FarmBlobs gRPC calls: same blobs, same checks. A data channel that fails (refused,
reset, silent, a standby, a corrupt or cut transfer) sends that call's next attempt over gRPC, which
follows the leader; the next registration announces the leader's own data port.
"""

from __future__ import annotations

import logging
import mmap
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np

from protos import bulkclient
from protos.auth import fetch_ca
from protos.blobwire import BlobStub, WireError, receive_into_buffer
from protos.retry import GaveUp, retry
from protos.tensors import MAGIC, decode_tensor
from worker.blobcache import BlobCache
from worker.connection import RECONNECT_MAX_S, RESULT_RETRY_S, Coordinators

log = logging.getLogger("farm.worker")

TRANSFER_TIMEOUT_S = 1800.0
UPLOAD_RETRY_S = 30.0  # how long a finished result's upload is retried before the task is reported failed
UPLOAD_AGAIN = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
                grpc.StatusCode.DATA_LOSS, grpc.StatusCode.INTERNAL, grpc.StatusCode.ABORTED)
FETCH_THREADS = 4  # a task's inputs fetched at once


def as_array(data: bytes | bytearray | mmap.mmap) -> np.ndarray:
    """A fetched blob as the array it holds (raw file inputs, e.g. a conditioning image, as bytes)."""
    if data[: len(MAGIC)] == MAGIC:
        return decode_tensor(data)
    return np.frombuffer(data, dtype=np.uint8)


class TransferError(Exception):
    """A result could not be uploaded within UPLOAD_RETRY_S: reported as the task's failure."""


class DataChannelFailed(Exception):
    """A transfer over the data channel failed: its next attempt goes over gRPC."""


class BlobTransfer:
    """The agent's blob traffic: its coordinators, its auth metadata (the agent's own list, so a
    reloaded token is used here too), its blob cache, and its stop event (a stop ends a retry)."""

    def __init__(self, coordinators: Coordinators, metadata: list, cache: BlobCache,
                 stopping: threading.Event) -> None:
        self.coordinators, self.metadata, self.cache, self.stopping = coordinators, metadata, cache, stopping
        self._bulk: dict[str, tuple[int, bool]] = {}  # coordinator address -> its data channel (port, TLS)

    def announce(self, address: str, port: int, tls: bool) -> None:
        """What the coordinator at address said at registration: its data port (0: none) and mode."""
        if port:
            self._bulk[address] = (port, tls)
        else:
            self._bulk.pop(address, None)

    def _bulk_call(self, address: str, call):
        """call(endpoint, secret) over the data channel of the coordinator at address; DataChannelFailed
        when it fails (or was forgotten meanwhile)."""
        try:
            port, tls = self._bulk[address]
            ca = fetch_ca(address, self.coordinators.fingerprint) if tls else None
            host = address.rpartition(":")[0].strip("[]")
            return call(bulkclient.Endpoint(host, port, ca), bulkclient.secret_of(self.metadata))
        except (OSError, ValueError, KeyError) as exc:  # socket, TLS; WireError, BulkRefused, TokenError
            raise DataChannelFailed(f"data channel of {address}: {exc}") from exc

    @property
    def address(self) -> str:
        """The coordinator the agent talks to now."""
        return self.coordinators.address

    def fetch_blob(self, sha: str) -> bytes | bytearray | mmap.mmap:
        """From the local cache, else streamed from the coordinator: hashed and written to the cache
        as it arrives (over the data channel: received straight into a map of the cache file), kept only
        when it verifies."""
        data = self.cache.get(sha)
        if data is not None:
            return data

        used = [""]  # the address the last attempt went to
        over_grpc = [False]  # after the data channel failed

        def get() -> bytearray | mmap.mmap:
            used[0] = self.address
            if not over_grpc[0] and used[0] in self._bulk:
                with self.cache.landing(sha) as land:
                    return self._bulk_call(used[0], lambda at, key: bulkclient.get(at, key, sha, land))
            with self.cache.writer(sha) as keep:
                stub = BlobStub(self.coordinators.channel(used[0]))
                return receive_into_buffer(stub.get(sha, TRANSFER_TIMEOUT_S, self.metadata), sha, keep)

        def away(exc: BaseException) -> bool:
            if isinstance(exc, DataChannelFailed):
                over_grpc[0] = True
                return True
            return isinstance(exc, grpc.RpcError) and self.coordinators.follow(exc, used[0])

        # A coordinator that dies mid-fetch: fetch again from the leader (a standby taking over, or the
        # same one restarted) while the heartbeat keeps the lease, instead of dropping the task.
        try:
            return retry(get, f"fetch of blob {sha[:12]}", transient=away, log=log, stop=self.stopping,
                         give_up_s=RESULT_RETRY_S, max_delay_s=RECONNECT_MAX_S)
        except WireError as exc:
            raise OSError(str(exc)) from None

    def fetch_inputs(self, shas: dict[str, str]) -> dict[str, np.ndarray]:
        """A task's inputs fetched side by side: each is a round trip or more (a tile has a handful), so
        their latencies overlap instead of adding up. A sha named twice is fetched once."""
        unique = sorted(set(shas.values()))
        got: dict[str, np.ndarray] = {}
        for sha in unique:  # cached ones here: a thread per local read costs more than it
            data = self.cache.get(sha)
            if data is not None:
                got[sha] = as_array(data)
        missing = [sha for sha in unique if sha not in got]
        if len(missing) <= 1:
            got.update({sha: self.fetch_input(sha) for sha in missing})
        else:
            with ThreadPoolExecutor(max_workers=min(FETCH_THREADS, len(missing)), thread_name_prefix="fetch") as pool:
                got.update(zip(missing, pool.map(self.fetch_input, missing), strict=True))
        return {name: got[sha] for name, sha in shas.items()}

    def fetch_input(self, sha: str) -> np.ndarray:
        return as_array(self.fetch_blob(sha))

    def upload(self, encoded: dict[str, bytes]) -> dict[str, str]:
        """Each output uploaded, retried through an outage or a corrupted transfer for UPLOAD_RETRY_S;
        then TransferError, which the task reports as its failure (not a silent lease expiry)."""

        over_grpc = [False]  # after the data channel failed

        def again(exc: BaseException) -> bool:
            if isinstance(exc, DataChannelFailed):
                over_grpc[0] = True
                return True
            if not isinstance(exc, grpc.RpcError):
                return False
            return self.coordinators.follow(exc, self.address) or exc.code() in UPLOAD_AGAIN

        shas = {}
        for name, data in encoded.items():
            over_grpc[0] = False
            try:
                shas[name] = retry(lambda d=data: self.put_blob(d, over_grpc[0]), f"upload of output {name}",
                                   transient=again, log=log, stop=self.stopping, give_up_s=UPLOAD_RETRY_S,
                                   max_delay_s=RECONNECT_MAX_S)
            except GaveUp as exc:
                raise TransferError(f"upload failed: {exc}") from exc
        return shas

    def put_blob(self, data: bytes | bytearray | memoryview, over_grpc: bool = False) -> str:
        """Streamed as views of data, hashed on the way; the coordinator verifies before keeping it. Over
        the data channel when the coordinator has one (DataChannelFailed when it fails), else gRPC."""
        address = self.address
        if not over_grpc and address in self._bulk:
            return self._bulk_call(address, lambda at, key: bulkclient.put(at, key, data))
        return BlobStub(self.coordinators.channel(address)).put(data, TRANSFER_TIMEOUT_S, self.metadata)
