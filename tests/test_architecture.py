"""The import graph keeps the floors of docs/architecture.md: no module imports a module of a
higher floor, and no two modules import each other, directly or around a cycle. Imports
inside functions count too: a lazy import is still a dependency.

`python tests/test_architecture.py` prints the graph, floor by floor.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"commbench": ROOT / "commbench", "commbench.analysis": ROOT / "analysis",
            "commbench.proxies": ROOT / "proxies"}

# 1 core data, 2 pure models and workloads, 3 runtime, 4 commands and readers of results.
FLOORS = {
    1: ["commbench", "commbench.sizes", "commbench.collectives", "commbench.schedule", "commbench.algorithms",
        "commbench.topology", "commbench.results", "commbench.environment", "commbench.files", "commbench.analysis",
        "commbench.proxies", "commbench.errors"],
    2: ["commbench.costmodel", "commbench.analysis.fit", "commbench.analysis.check",
        "commbench.analysis.scaling", "commbench.analysis.nccl_tuning", "commbench.analysis.intervals",
        "commbench.analysis.stragglers", "commbench.analysis.published", "commbench.analysis.calibration",
        "commbench.analysis.collective_corpus",
        "commbench.analysis.scale_terms", "commbench.analysis.provenance",
        "commbench.analysis.predict", "commbench.analysis.predict_scaling", "commbench.proxies.profile",
        "commbench.proxies.buckets", "commbench.proxies.timeline", "commbench.proxies.catalog",
        "commbench.proxies.setups", "commbench.proxies.comm_plan",
        "commbench.proxies.models*", "commbench.proxies.units"],
    3: ["commbench.launch", "commbench.emulate*", "commbench.job", "commbench.bench", "commbench.table",
        "commbench.telemetry",
        "commbench.backends*", "commbench.proxies.config", "commbench.proxies.context", "commbench.proxies.replay",
        "commbench.proxies.train", "commbench.proxies.train_setups", "commbench.proxies.run",
        "commbench.proxies.steps", "commbench.proxies.channels",
        "commbench.proxies.extract"],
    4: ["commbench.cli", "commbench.__main__", "commbench.commands*", "commbench.analysis.report",
        "commbench.analysis.report_steps", "commbench.analysis.report_compare", "commbench.analysis.compare",
        "commbench.analysis.report_timeline"],
}


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([package, *parts])
            if package == "commbench" and name.startswith(("commbench.analysis", "commbench.proxies")):
                continue
            found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the commbench modules it imports (anywhere in its body)."""
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                               else node.module for alias in node.names)
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def floor_of(module: str) -> int | None:
    for floor, patterns in FLOORS.items():
        for pattern in patterns:
            if module == pattern or (pattern.endswith("*") and module.startswith(pattern[:-1])):
                return floor
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_has_a_floor():
    assert [m for m in modules() if floor_of(m) is None] == []


def test_imports_only_point_down():
    graph = import_graph()
    upward = [f"{m} (floor {floor_of(m)}) imports {t} (floor {floor_of(t)})"
              for m, targets in graph.items() for t in sorted(targets) if floor_of(t) > floor_of(m)]
    assert upward == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_checks_can_fail():
    """The checkers see an upward import and a cycle when there is one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert floor_of("commbench.cli") == 4 and floor_of("commbench.backends.shm") == 3


if __name__ == "__main__":
    graph = import_graph()
    for floor in sorted(FLOORS, reverse=True):
        print(f"floor {floor}")
        for module in sorted(m for m in graph if floor_of(m) == floor):
            print(f"  {module} -> {', '.join(sorted(t.replace('commbench.', '') for t in graph[module])) or '-'}")
    sys.exit(1 if cycles(graph) else 0)
