"""A bounded, seeded fuzz of every farm RPC over real TLS gRPC: random and mutated messages (and raw
bytes that do not decode) never end in UNKNOWN, and the coordinator keeps serving afterwards."""

from __future__ import annotations

import json
import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor

from coordinator.auth import auth_metadata, load_or_create_token
from coordinator.server import serve, stop
from farm_cli.client import FarmClient
from protos import farm_pb2
from protos.auth import farm_channel

CALLS = 300
SEED = 20261130
STRINGS = ["", "x:tasks", "../../../etc/passwd", "/etc/passwd", "w" * 5000, "\x00", "é☃", "r1", "tiny",
           "a b", "-1", "{}", "null", "0" * 64]
JSON_TEXTS = ['{"prompt": 5}', '{"frame_rate": 1e999}', '{"packs": 5}', "[" * 5000, '{"stage2_sigmas": [NaN, 0]}',
              "{}", '{"prompt": "a fox", "pack": "tiny"}', "nope", '{"memory_bytes": "x"}', '{"a": ' * 50 + "1" + "}" * 50]


def _value(rng: random.Random, field: FieldDescriptor):
    kind = field.type
    if kind == FieldDescriptor.TYPE_STRING:
        return rng.choice(JSON_TEXTS if field.name.endswith("json") else STRINGS)
    if kind == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 100, 5000]))
    if kind == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if kind in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64):
        return rng.choice([0, -1, 1, 2**63 - 1, -(2**63), rng.randrange(-1000, 1000)])
    if kind in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_ENUM):
        return rng.choice([0, -1, 1, 2**31 - 1, rng.randrange(-100, 100)])
    if kind in (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED64):
        return rng.choice([0, 1, 2**32 - 1])
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e300])
    return None


def random_message(rng: random.Random, cls):
    message = cls()
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3 or field.type == FieldDescriptor.TYPE_MESSAGE:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(message, field.name)[rng.choice(STRINGS)[:64]] = rng.choice(STRINGS)[:64]
            continue
        value = _value(rng, field)
        if value is None:
            continue
        if field.is_repeated:
            getattr(message, field.name).extend([value] * rng.randrange(0, 3))
        else:
            setattr(message, field.name, value)
    if "wait_ms" in cls.DESCRIPTOR.fields_by_name:
        message.wait_ms = min(abs(message.wait_ms), 300)  # bound the test's time, not the server's checks
    return message


def _methods() -> list[tuple[str, object, object, bool, bool]]:
    found = []
    for service in farm_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            request = getattr(farm_pb2, method.input_type.name)
            reply = getattr(farm_pb2, method.output_type.name)
            found.append((f"/{service.full_name}/{method.name}", request, reply, method.client_streaming,
                          method.server_streaming))
    return found


def _one_call(channel: grpc.Channel, md, rng: random.Random, method) -> str:
    path, request, reply, client_streaming, server_streaming = method
    raw = rng.random() < 0.15  # bytes that may not decode as the request
    serialize = (lambda b: b) if raw else request.SerializeToString
    payload = rng.randbytes(rng.randrange(1, 200)) if raw else random_message(rng, request)
    kw = {"timeout": 2.0, "metadata": md}
    try:
        if client_streaming and server_streaming:
            return "skipped"
        if client_streaming:
            call = channel.stream_unary(path, request_serializer=serialize, response_deserializer=reply.FromString)
            call(iter([payload] * rng.randrange(1, 3)), **kw)
        elif server_streaming:
            call = channel.unary_stream(path, request_serializer=serialize, response_deserializer=reply.FromString)
            for _ in call(payload, **kw):
                pass
        else:
            call = channel.unary_unary(path, request_serializer=serialize, response_deserializer=reply.FromString)
            call(payload, **kw)
        return "OK"
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNKNOWN:
            return f"UNKNOWN {path} {exc.details()}"
        return exc.code().name


@pytest.mark.timeout(240)
def test_fuzzed_calls_never_end_unknown_and_the_coordinator_keeps_serving(store, tmp_data: Path,
                                                                           tiny_packs: Path) -> None:
    (tmp_data / "packs").symlink_to(tiny_packs)
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token, lease_ms=2000)
    address, rng, methods = f"127.0.0.1:{port}", random.Random(SEED), _methods()
    plan = [(random.Random(rng.random()), rng.choice(methods)) for _ in range(CALLS)]
    try:
        with farm_channel(address, token) as channel:
            md = auth_metadata(token)
            with ThreadPoolExecutor(8) as pool:
                codes = Counter(pool.map(lambda item: _one_call(channel, md, *item), plan))
        unknown = [code for code in codes if code.startswith("UNKNOWN")]
        print(f"{CALLS} fuzzed calls: {dict(codes)}")
        assert not unknown, unknown
        assert sum(codes.values()) == CALLS and codes["INVALID_ARGUMENT"] > 0
        with FarmClient(address, token, timeout=10) as client:
            render_id = client.submit({"prompt": "after the fuzz", "pack": "tiny"})
            assert client.get(render_id)["state"] == "queued"
    finally:
        stop(server, grace=0)
    assert json.dumps(dict(codes))  # the tally is plain data for the log


def _rss_kb() -> int:
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))
    except OSError:
        pytest.skip("no /proc/self/status to read this process's resident memory")


@pytest.mark.timeout(120)
def test_undecodable_messages_do_not_grow_the_coordinator(store, tmp_data: Path) -> None:
    """grpcio's own failed-parse path kept ~16 KB per message (measured: 3,000 messages grew a
    coordinator by ~50 MB, the open health service alike); requests are parsed by the Guard instead."""
    token = load_or_create_token(tmp_data)
    server, port = serve(store, tmp_data, token=token)
    rng = random.Random(SEED)
    try:
        with farm_channel(f"127.0.0.1:{port}", token) as channel:
            md = auth_metadata(token)
            calls = [(channel.unary_unary(path, request_serializer=lambda b: b, response_deserializer=lambda b: b), m)
                     for path, m in (("/ltxfarm.v1.FarmClient/GetRender", md), ("/grpc.health.v1.Health/Check", None))]

            def blast(n: int) -> None:
                for i in range(n):
                    call, metadata = calls[i % 2]
                    with pytest.raises(grpc.RpcError) as refused:
                        call(b"\xff" + rng.randbytes(rng.randrange(5, 200)), timeout=5, metadata=metadata)
                    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

            blast(300)  # warm: channels, caches, first allocations
            before = _rss_kb()
            blast(2000)
            grown = _rss_kb() - before
        print(f"2000 undecodable messages: RSS grew {grown} kB")
        assert grown < 8 * 1024  # was ~32 MB for 2000
    finally:
        stop(server, grace=0)
