"""What a machine runs: this project's version, its chip and MLX backend, and its installed set.

A render's bits depend on the code and libraries each Mac runs, so a worker reports them at
registration and the coordinator compares them (refuses another project version, shows the rest).

The installed set is two hashes, both short sha256 prefixes:
- `lock`: the `requirements.lock` file at the repository root (what an install resolves to), or
  "no lock" when the checkout has none. Two Macs with one lock were meant to install the same set.
- `installed`: the `name==version` of every installed distribution the lock names (the project's own
  requirements when there is no lock). A Mac that installed around the lock (a `pip install -U`, an
  older venv) shows another hash even though its lock file is the same.
Only the lock's names count, so a tool installed beside the farm (ipython, a linter) changes nothing.
"""

from __future__ import annotations

import hashlib
import platform
import re
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

PROJECT = "ltx-farm"
LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
NO_LOCK = "no lock"
HASH_CHARS = 12
UPGRADE_COMMAND = "git pull && .venv/bin/pip install -c requirements.lock -e . && restart the worker"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)")


def _normal(name: str) -> str:
    """PEP 503 normal form: `Foo_Bar` and `foo-bar` are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_CHARS]


def project_version() -> str:
    """This checkout's version (pyproject's `version`, as installed), "unknown" when not installed."""
    try:
        return metadata.version(PROJECT)
    except metadata.PackageNotFoundError:
        return "unknown"


def lock_pins(lock: Path = LOCK) -> dict[str, set[str]]:
    """The lock's pins, {normal name: versions} (a universal lock may pin one name per platform)."""
    pins: dict[str, set[str]] = {}
    if not lock.is_file():
        return pins
    for line in lock.read_text().splitlines():
        found = _PIN.match(line.strip())
        if found:
            pins.setdefault(_normal(found[1]), set()).add(found[2])
    return pins


def _required_names() -> list[str]:
    """Without a lock: the names the project itself requires (its direct dependencies)."""
    try:
        wanted = metadata.requires(PROJECT) or []
    except metadata.PackageNotFoundError:
        return []
    names = (re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r) for r in wanted if "extra ==" not in r)
    return sorted({_normal(m[0]) for m in names if m})


def installed_versions(names: list[str]) -> dict[str, str]:
    """{name: installed version} of those names that are installed here (a marker may leave one out)."""
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def installed_set(lock: Path = LOCK) -> dict[str, str]:
    """{"lock": hash or "no lock", "installed": hash of the installed name==version the lock names}."""
    pins = lock_pins(lock)
    names = sorted(pins) if pins else _required_names()
    versions = installed_versions(names)
    return {"lock": _short(lock.read_text()) if lock.is_file() else NO_LOCK,
            "installed": _short("\n".join(f"{n}=={v}" for n, v in sorted(versions.items())))}


def off_lock(lock: Path = LOCK) -> list[str]:
    """Installed distributions whose version the lock does not pin (`name version, lock: pins`). A local
    build of a pinned release (torch 2.13.0+cpu for 2.13.0) is that release, as pip's `==` reads it."""
    pins = lock_pins(lock)
    return [f"{name} {version} (lock: {', '.join(sorted(pins[name]))})"
            for name, version in sorted(installed_versions(sorted(pins)).items())
            if version not in pins[name] and version.split("+", 1)[0] not in pins[name]]


@cache
def chip_name() -> str:
    """The chip in words: the Mac's brand string ("Apple M2 Pro"), Linux's CPU model name, else the
    machine type. The cost model reads chip names (M1 ... M4), and provenance records them."""
    if platform.system() == "Darwin":
        try:
            found = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=5, check=False).stdout.strip()
        except OSError:
            found = ""
        if found:
            return found
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
