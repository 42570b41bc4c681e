"""requirements.lock is what every install resolves: it covers pyproject, this environment matches it,
and the checked-in gRPC code was written by the generator it pins."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from protos import generate

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "requirements.lock"
# Installed --no-deps beside the lock (README): its own pins would fight ours.
OUTSIDE_THE_LOCK = {"ltx-core", "ltx-farm"}


def locked_pins() -> dict[str, Version]:
    """name -> the version the lock pins for this interpreter and platform (markers evaluated)."""
    pins: dict[str, Version] = {}
    for line in LOCK.read_text().splitlines():
        if not line or line[0] in "# ":
            continue
        requirement, _, marker = line.partition(";")
        name, _, version = requirement.strip().partition("==")
        if marker.strip() and not Marker(marker.strip()).evaluate():
            continue
        assert canonicalize_name(name) not in pins, f"{name} pinned twice for this platform"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def project_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [r for r in map(Requirement, listed) if r.marker is None or r.marker.evaluate()]


def test_the_lock_pins_every_requirement_within_its_range() -> None:
    pins = locked_pins()
    for requirement in project_requirements():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not in requirements.lock: run ops/lock.sh"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {name}=={pins[name]}, outside pyproject's {requirement}: run ops/lock.sh"
        )


def test_this_environment_is_the_locked_set() -> None:
    """An install that skipped the lock (or a package upgraded by hand) is named here."""
    pins = locked_pins()
    differ = []
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name in OUTSIDE_THE_LOCK or name not in pins:
            continue
        installed = Version(dist.version)
        if Version(installed.public) != pins[name]:  # a local build (torch 2.13.0+cpu) is that release
            differ.append(f"{name} {installed} (lock: {pins[name]})")
    assert not differ, "installed outside the lock: " + ", ".join(differ)


@pytest.mark.parametrize("name", ["farm_pb2.py", "farm_pb2_grpc.py"])
def test_checked_in_grpc_code_is_the_locked_generators(name: str) -> None:
    """The lock makes generator and checked-in code equal by construction: the stamp in the file is
    the grpcio-tools the lock pins, and the runtimes it pins can load that code."""
    pins = locked_pins()
    stamps = generate.generator_versions((generate.PROTO_DIR / name).read_text())
    if "grpc" in stamps:
        assert Version(stamps["grpc"]) == pins["grpcio-tools"], "regenerate: python -m protos.generate"
        assert pins["grpcio"] >= Version(stamps["grpc"])
    if "protobuf" in stamps:
        gencode = Version(stamps["protobuf"])
        assert pins["protobuf"] >= gencode and pins["protobuf"].major == gencode.major
    assert stamps, f"{name} carries no generator stamp"
