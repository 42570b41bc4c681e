"""The wire contract: generated code is reproducible from the .proto and imports package-relative."""

from __future__ import annotations

import re
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


def test_a_generator_release_alone_is_not_stale(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another grpcio-tools stamps its own version into the files; only a contract change is stale."""
    for name in ("farm.proto", "farm_pb2.py", "farm_pb2.pyi", "farm_pb2_grpc.py"):
        shutil.copy(generate.PROTO_DIR / name, tmp_path / name)
    monkeypatch.setattr(generate, "PROTO_DIR", tmp_path)
    grpc_code, pb_code = tmp_path / "farm_pb2_grpc.py", tmp_path / "farm_pb2.py"
    grpc_code.write_text(re.sub(r"GRPC_GENERATED_VERSION = '[^']*'", "GRPC_GENERATED_VERSION = '9.99.0'",
                                grpc_code.read_text()))
    restamped = re.sub(r"(ValidateProtobufRuntimeVersion\(\n\s*\S+,\n\s*)\d+,\n\s*\d+,\n\s*\d+,",
                       r"\g<1>9,\n    99,\n    0,", pb_code.read_text())
    pb_code.write_text(re.sub(r"# Protobuf Python Version: \S+", "# Protobuf Python Version: 9.99.0", restamped))
    assert generate.generator_versions(grpc_code.read_text()) == {"grpc": "9.99.0"}
    assert generate.generator_versions(pb_code.read_text()) == {"protobuf": "9.99.0"}
    assert "9,\n    99,\n    0," in pb_code.read_text()
    assert generate.stale_files() == []
    pb_code.write_text(pb_code.read_text().replace("ltxfarm.v1", "ltxfarm.v2"))  # the contract itself
    assert generate.stale_files() == ["farm_pb2.py"]


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
