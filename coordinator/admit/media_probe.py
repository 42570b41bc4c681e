"""Probe an untrusted media file without decoding it in this process.

`probe_media` runs `coordinator.admit.media_probe_child` in a subprocess that caps its own memory and CPU
(RLIMIT_AS / RLIMIT_CPU) and is killed past a wall-clock limit here, so a crafted, truncated or huge
file costs one refusal and never this process. It returns a typed `MediaInfo` or raises
`MediaRefused` with one line naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from coordinator.admit.media_rules import NEEDS, MediaInfo, MediaRefused, ProbeLimits

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
_SIGNALS = {signal.SIGXCPU: "ran past its CPU-time limit", signal.SIGKILL: "was killed (memory or CPU limit)",
            signal.SIGSEGV: "crashed (SIGSEGV)", signal.SIGABRT: "crashed (SIGABRT)"}


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "LC_ALL", "HOME", "TMPDIR")}
    env["PYTHONPATH"] = _REPO_ROOT
    return env


def _failure(proc: subprocess.CompletedProcess) -> str:
    """Why the child gave no answer, from its exit status and the tail of its stderr."""
    if proc.returncode < 0:
        sig = signal.Signals(-proc.returncode)
        return f"probe {_SIGNALS.get(sig, f'was stopped by {sig.name}')}"
    tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    if any(word in tail[0] for word in ("MemoryError", "failed to map segment", "Cannot allocate memory")):
        return "probe ran out of memory"
    return f"probe failed (exit {proc.returncode}: {tail[0][:200]})"


def _run_child(path: Path, need: str, limits: ProbeLimits) -> subprocess.CompletedProcess:
    """`python -m coordinator.admit.media_probe_child`, this repository first on its path, no stdin."""
    cmd = [sys.executable, "-s", "-m", "coordinator.admit.media_probe_child", str(path), need,
           json.dumps(limits.to_dict())]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, timeout=limits.wall_s,
                          env=_child_env(), cwd=_REPO_ROOT, check=False)


def probe_media(path: str | os.PathLike, need: str = "any", limits: ProbeLimits | None = None) -> MediaInfo:
    """MediaInfo for `path`, or MediaRefused("<name>: <reason>")."""
    if need not in NEEDS:
        raise ValueError(f"need must be one of {NEEDS}, not {need!r}")
    limits = limits or ProbeLimits()
    path = Path(path)
    name = path.name
    if not path.is_file():
        raise MediaRefused(f"{name}: no such file")
    size = path.stat().st_size
    if size == 0 or size > limits.max_bytes:
        raise MediaRefused(f"{name}: {size} bytes, outside 1..{limits.max_bytes}")
    try:
        proc = _run_child(path, need, limits)
    except subprocess.TimeoutExpired:
        raise MediaRefused(f"{name}: probing took longer than {limits.wall_s:g} s") from None
    lines = proc.stdout.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise MediaRefused(f"{name}: {_failure(proc)}")
    answer = json.loads(lines[-1])
    if "refused" in answer:
        raise MediaRefused(f"{name}: {answer['refused']}")
    return MediaInfo.from_dict(answer["ok"])
