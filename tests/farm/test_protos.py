"""The wire contract: generated code is reproducible from the .proto and imports package-relative."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protos import farm_pb2, farm_pb2_grpc, generate

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_generated_code_is_not_stale() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "protos.generate", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_check_reports_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("farm.proto", "farm_pb2.py", "farm_pb2.pyi", "farm_pb2_grpc.py"):
        shutil.copy(generate.PROTO_DIR / name, tmp_path / name)
    monkeypatch.setattr(generate, "PROTO_DIR", tmp_path)
    assert generate.main(["--check"]) == 0
    (tmp_path / "farm_pb2_grpc.py").write_text("# hand edit\n")
    (tmp_path / "farm_pb2.pyi").unlink()
    assert sorted(generate.stale_files()) == ["farm_pb2.pyi", "farm_pb2_grpc.py"]
    assert generate.main(["--check"]) == 1
    generate.main([])
    assert generate.stale_files() == []


def test_generated_grpc_imports_are_package_relative() -> None:
    text = (generate.PROTO_DIR / "farm_pb2_grpc.py").read_text()
    assert "from protos import farm_pb2 as" in text
    assert "\nimport farm_pb2" not in text
    assert farm_pb2_grpc.farm__pb2 is farm_pb2


def test_contract_shape() -> None:
    services = farm_pb2.DESCRIPTOR.services_by_name
    assert farm_pb2.DESCRIPTOR.package == "ltxfarm.v1"
    assert set(services) == {"FarmClient", "FarmWorker", "FarmBlobs", "FarmPacks"}
    assert set(services["FarmWorker"].methods_by_name) == {
        "Register",
        "Lease",
        "Heartbeat",
        "Complete",
        "Fail",
        "Attach",
        "Upcoming",
    }
    attach = services["FarmWorker"].methods_by_name["Attach"]
    assert attach.server_streaming and not attach.client_streaming
    put = services["FarmBlobs"].methods_by_name["PutBlob"]
    assert put.client_streaming and not put.server_streaming
    assert services["FarmClient"].methods_by_name["Watch"].server_streaming
    reply = farm_pb2.LeaseReply(has_task=True, inputs={"x": "ab" * 32}, fence=7)
    assert farm_pb2.LeaseReply.FromString(reply.SerializeToString()).inputs["x"] == "ab" * 32
    assert farm_pb2.TaskStatus.Name(farm_pb2.STALE) == "STALE"
