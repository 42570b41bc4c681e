"""FarmClient: the CLI's typed wrapper over the coordinator's gRPC services.

Every call carries the bearer token and a deadline. A coordinator that is down or too slow becomes
CoordinatorUnreachable with a one-line message the CLI can print as is; other refusals become
FarmError (with the gRPC code) so nobody sees a gRPC traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from protos import farm_pb2, farm_pb2_grpc
from protos.auth import NOT_THIS_FARM, TokenError, auth_metadata, farm_channel
from protos.blobwire import BlobStub, WireError, receive_into_buffer
from protos.endpoints import LEADER_WAIT_S, Endpoints, leader_hint, never_delivered
from protos.states import TERMINAL
from protos.tensors import CHUNK_BYTES

WATCH_TIMEOUT_S = 24 * 3600.0
WATCH_POLL_S = 1.0  # while the coordinator relays its limit of watchers
TRANSFER_TIMEOUT_S = 3600.0
LEADER_RETRY_S = 0.5  # between tries while no coordinator leads


class FarmError(Exception):
    """The coordinator refused a call; str() is one line fit for the terminal."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


class CoordinatorUnreachable(FarmError):
    """No answer from the coordinator (down, wrong address, network, deadline)."""


class BlobCorrupt(FarmError):
    """Downloaded bytes do not hash to the sha256 that was asked for."""


def _one_line(text: str) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def translate(exc: grpc.RpcError, address: str) -> FarmError:
    """Map a gRPC error to the CLI's exceptions with a one-line message."""
    code = exc.code() if hasattr(exc, "code") else None
    details = _one_line(exc.details() if hasattr(exc, "details") else str(exc))
    if NOT_THIS_FARM in details:  # the pinned CA refused the server: say so, not "unreachable"
        return FarmError(details, code)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        why = "timed out" if code == grpc.StatusCode.DEADLINE_EXCEEDED else "unavailable"
        return CoordinatorUnreachable(f"coordinator at {address} is unreachable ({why})", code)
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
        return FarmError(f"the coordinator at {address} refused the farm token: the token is the file "
                         "DATA/token on the coordinator's machine (~/.ltx-farm/token by default); copy it to "
                         "~/.ltx-farm/token here, or give --token-file / FARM_TOKEN", code)
    return FarmError(details or f"the coordinator refused the call ({_plain(code)})", code)


def _plain(code: grpc.StatusCode | None) -> str:
    return code.name.lower().replace("_", " ") if code is not None else "unknown error"


def blob_chunks(data: bytes, sha: str) -> Iterator[farm_pb2.BlobChunk]:
    """~1 MiB chunks; the first names the sha256 so the receiver can verify."""
    view = memoryview(data)
    yield farm_pb2.BlobChunk(sha256=sha, data=bytes(view[:CHUNK_BYTES]))
    for i in range(CHUNK_BYTES, len(data), CHUNK_BYTES):
        yield farm_pb2.BlobChunk(data=bytes(view[i : i + CHUNK_BYTES]))


def receive_blob(stream: Iterator[farm_pb2.BlobChunk], sha: str) -> bytes:
    """Join a GetBlob stream and refuse it unless it hashes to sha."""
    hasher = hashlib.sha256()
    parts = []
    for chunk in stream:
        hasher.update(chunk.data)
        parts.append(chunk.data)
    actual = hasher.hexdigest()
    if actual != sha:
        raise BlobCorrupt(f"blob {sha[:12]} arrived corrupt (got {actual[:12]})")
    return b"".join(parts)


def no_token(address: str) -> FarmError:
    """What to say when this machine holds no farm token. Where no coordinator even listens at the
    address, the person has no farm yet: the unreachable line (start one with `farm up`, or --local) is
    their next step, not where a token file comes from."""
    import socket

    from protos.auth import NO_TOKEN

    for each in Endpoints(address).addresses:
        host, _, port = each.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=2.0).close()
        except (OSError, ValueError):
            continue
        return FarmError(NO_TOKEN)
    return CoordinatorUnreachable(f"coordinator at {address} is unreachable (nothing listens there)")


class FarmClient:
    """A channel per coordinator address ("host:port[,host:port...]"); calls go to the leader. Methods
    return plain dicts / ids."""

    def __init__(self, address: str, token: str, timeout: float = 10.0) -> None:
        self.endpoints = Endpoints(address)
        self.timeout = timeout
        if not (token or "").strip():
            raise no_token(address)
        try:
            self._metadata = auth_metadata(token)
        except TokenError as exc:
            raise FarmError(str(exc)) from None
        self._token = token
        self._channels: dict[str, grpc.Channel] = {}
        self._probe = len(self.endpoints.addresses) > 1  # find the leader before the first call
        self.leader_wait_s = LEADER_WAIT_S  # with several coordinators: how long a call waits for a leader

    @property
    def address(self) -> str:
        return self.endpoints.current

    @property
    def _channel(self) -> grpc.Channel:
        if self._probe:
            self._probe = False
            self._find_leader()
        address = self.address
        if address not in self._channels:
            self._channels[address] = self._open(address)
        return self._channels[address]

    def _open(self, address: str) -> grpc.Channel:
        try:
            return farm_channel(address, self._token)
        except TokenError as exc:
            raise FarmError(str(exc)) from None

    @property
    def _client(self) -> farm_pb2_grpc.FarmClientStub:
        return farm_pb2_grpc.FarmClientStub(self._channel)

    @property
    def _blobs(self) -> farm_pb2_grpc.FarmBlobsStub:
        return farm_pb2_grpc.FarmBlobsStub(self._channel)

    def _find_leader(self) -> None:
        """Ask each coordinator's (open) health service which one serves; stay put when none says so."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        start = self.endpoints.addresses.index(self.address)
        order = self.endpoints.addresses[start:] + self.endpoints.addresses[:start]
        for address in order:
            channel = self._channels.get(address) or self._channels.setdefault(address, self._open(address))
            request = health_pb2.HealthCheckRequest(service="ltxfarm.v1.FarmClient")
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(request, timeout=min(self.timeout, 3.0))
            except grpc.RpcError:
                continue
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                self.endpoints.use(address)
                return

    def follow(self, exc: grpc.RpcError, address: str) -> None:
        """A call to `address` found no serving coordinator: the next call goes to the leader it named,
        else to whichever coordinator serves (probed), else to the next address."""
        if exc.code() == grpc.StatusCode.UNAVAILABLE and len(self.endpoints.addresses) > 1:
            self.endpoints.move(address, exc.details())
            self._probe = leader_hint(exc.details()) is None

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _rpc(self, name: str, variant: str = ""):
        """A method of the FarmClient service, looked up on the current coordinator at each call (so a
        call sent again after a takeover goes to the new leader)."""
        def call(request, **kwargs):
            method = getattr(self._client, name)
            return (getattr(method, variant) if variant else method)(request, **kwargs)

        return call

    def _call(self, method, request, timeout: float | None = None):
        """One unary call. With several coordinators and none leading (a takeover under way), a call
        that reached no leader is sent again until one leads, up to leader_wait_s (one line says so)."""
        waiting_since: float | None = None
        redirected = False
        while True:
            address = self.address
            try:
                return method(request, timeout=timeout or self.timeout, metadata=self._metadata)
            except grpc.RpcError as exc:
                self.follow(exc, address)
                if not redirected and len(self.endpoints.addresses) > 1 and leader_hint(exc.details()):
                    redirected = True  # a standby named the leader: ask it straight away
                    continue
                waiting_since = self._wait_for_leader(exc, waiting_since)
                if waiting_since is None:
                    raise translate(exc, address) from None

    def _wait_for_leader(self, exc: grpc.RpcError, since: float | None) -> float | None:
        """The time we began waiting for a leader (returned after a short sleep: try again), or None: fail
        now (one coordinator only, a refusal, a call that may have landed, or the wait is over)."""
        if (len(self.endpoints.addresses) < 2 or self.leader_wait_s <= 0 or exc.code() != grpc.StatusCode.UNAVAILABLE
                or not never_delivered(exc.details())):
            return None
        now = time.monotonic()
        if since is None:
            print(f"farm: no coordinator of {self.endpoints} leads right now ({_one_line(exc.details())}); "
                  f"waiting up to {self.leader_wait_s:.0f} s for one", file=sys.stderr, flush=True)
            since = now
        elif now - since > self.leader_wait_s:
            return None
        time.sleep(LEADER_RETRY_S)
        return since

    def _stream(self, method, request, timeout: float) -> Iterator[Any]:
        address = self.address
        try:
            yield from method(request, timeout=timeout, metadata=self._metadata)
        except grpc.RpcError as exc:
            self.follow(exc, address)
            raise translate(exc, address) from None

    def submit(self, spec: dict) -> str:
        reply = self._call(self._rpc("Submit"), farm_pb2.SubmitRequest(spec_json=json.dumps(spec)))
        return reply.render_id

    def get(self, render_id: str) -> dict:
        return json.loads(
            self._call(self._rpc("GetRender"), farm_pb2.RenderRequest(render_id=render_id)).json
        )

    def list(self, limit: int = 50) -> list[dict]:
        reply = self._call(self._rpc("ListRenders"), farm_pb2.ListRendersRequest(limit=limit))
        return [json.loads(r.json) for r in reply.renders]

    def watch(self, render_id: str, after: str = "0", timeout: float = WATCH_TIMEOUT_S) -> Iterator[dict]:
        """Events as dicts (with "_id" = stream id) until the render is terminal. A coordinator that
        relays its limit of watchers says RESOURCE_EXHAUSTED: then poll the render until it ends or a
        relay frees up (resuming after the last event seen)."""
        deadline = time.monotonic() + timeout
        batches = True  # WatchBatches: the events of a delivery in one message; an older coordinator has Watch
        while True:
            request = farm_pb2.WatchRequest(render_id=render_id, after_event_id=after)
            try:
                for event in self._watch_events(request, timeout, batches):
                    payload = json.loads(event.json) if event.json else {}
                    payload.setdefault("_id", event.id)
                    after = str(payload["_id"])
                    yield payload
                return
            except FarmError as exc:
                if batches and exc.code == grpc.StatusCode.UNIMPLEMENTED:
                    batches = False
                    continue
                if exc.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
            if self.get(render_id).get("state") in TERMINAL or time.monotonic() > deadline:
                return
            time.sleep(WATCH_POLL_S)

    def _watch_events(self, request: farm_pb2.WatchRequest, timeout: float, batches: bool) -> Iterator[farm_pb2.Event]:
        if not batches:
            yield from self._stream(self._client.Watch, request, timeout)
            return
        for batch in self._stream(self._client.WatchBatches, request, timeout):
            yield from batch.events

    def cancel(self, render_id: str) -> bool:
        return self._call(self._rpc("Cancel"), farm_pb2.RenderRequest(render_id=render_id)).cancelled

    def fetch_output(self, render_id: str, path: Path, timeout: float = TRANSFER_TIMEOUT_S, file: str = "") -> Path:
        """Download the render's mp4 (or another of its files: render.json, exr/frame_00000.exr) to path,
        written to a temp name, then renamed."""
        path = Path(path)
        tmp = path.with_name(path.name + ".part")
        try:
            with open(tmp, "wb") as f:
                request = farm_pb2.RenderRequest(render_id=render_id, file=file)
                for chunk in self._stream(self._client.FetchOutput, request, timeout):
                    f.write(chunk.data)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return path

    def fetch_exr(self, render_id: str, folder: Path, timeout: float = TRANSFER_TIMEOUT_S) -> int:
        """The render's EXR frames and their render.json into folder (on this machine: the coordinator
        writes them only into its own render folder). Returns the number of frames."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        meta = self.fetch_output(render_id, folder / "render.json", timeout, file="exr/render.json")
        frames = int(json.loads(meta.read_text()).get("outputs", {}).get("exr_frames") or 0)
        for index in range(frames):
            name = f"frame_{index:05d}.exr"
            self.fetch_output(render_id, folder / name, timeout, file=f"exr/{name}")
        return frames

    def put_blob(self, data: bytes | bytearray | memoryview, timeout: float = TRANSFER_TIMEOUT_S) -> str:
        """Streamed as views, hashed on the way (protos.blobwire); the sha256 both ends agree on."""
        try:
            return self._call(lambda _, **kw: BlobStub(self._channel).put(data, **kw), None, timeout=timeout)
        except WireError as exc:
            raise BlobCorrupt(str(exc)) from None

    def get_blob(self, sha: str, timeout: float = TRANSFER_TIMEOUT_S) -> bytes:
        """The blob, verified as it streams in."""
        chunks = self._stream(lambda _, **kw: BlobStub(self._channel).get(sha, **kw), None, timeout)
        try:
            return bytes(receive_into_buffer(chunks, sha))
        except WireError as exc:
            raise BlobCorrupt(str(exc)) from None

    def packs(self) -> list[dict]:
        """The packs the coordinator serves to workers: name, files, bytes."""
        reply = self._call(lambda request, **kw: farm_pb2_grpc.FarmPacksStub(self._channel).ListPacks(request, **kw), farm_pb2.ListPacksRequest())
        return [{"name": p.name, "files": int(p.files), "bytes": int(p.bytes)} for p in reply.packs]

    def drain(self, worker_id: str) -> bool:
        """Ask a worker to finish its task, take no more and exit. False when no worker has that id."""
        return self._call(self._rpc("DrainWorker"), farm_pb2.DrainRequest(worker_id=worker_id)).found

    def requeue(self, render_id: str, task_id: str = "") -> tuple[bool, bool]:
        """(blocklist cleared, task requeued): the render's blocklisted workers get another chance; with a
        task id, that task is also taken from its worker and queued again."""
        reply = self._call(self._rpc("Requeue"), farm_pb2.RequeueRequest(render_id=render_id, task_id=task_id))
        return reply.cleared, reply.requeued

    def retry(self, render_id: str) -> str:
        """Run a failed or cancelled render again under its id (only its unfinished tasks): 'retried', or
        why not ('live', 'gone')."""
        return self._call(self._rpc("RetryRender"), farm_pb2.RenderRequest(render_id=render_id)).outcome

    def delete(self, render_id: str) -> tuple[bool, str]:
        """(deleted, state): a live render is not deleted and its state says why."""
        reply = self._call(self._rpc("DeleteRender"), farm_pb2.RenderRequest(render_id=render_id))
        return reply.deleted, reply.state

    def prune(self, older_than_days: float) -> dict:
        """Forget renders that ended more than older_than_days ago and the blobs nothing names."""
        reply = self._call(self._rpc("Prune"), farm_pb2.PruneRequest(older_than_days=older_than_days))
        return {"render_ids": list(reply.render_ids), "blobs": reply.blobs, "blob_bytes": reply.blob_bytes}

    def workers(self) -> list[dict]:
        reply = self._call(self._rpc("ListWorkers"), farm_pb2.ListWorkersRequest())
        return [json.loads(w.json) for w in reply.workers]

    def clock_ms(self) -> int:
        """The farm's clock (the coordinator's Redis TIME) in ms, from ListWorkers' trailing metadata."""
        _reply, call = self._call(self._rpc("ListWorkers", "with_call"), farm_pb2.ListWorkersRequest())
        found = dict(call.trailing_metadata() or ()).get("farm-now-ms")
        if found is None:
            raise FarmError("this coordinator does not report its clock (an older version)")
        return int(found)
