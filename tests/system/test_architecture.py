"""The import graph keeps the floors and the folders of docs/architecture.md: no module imports a
module of a higher floor, none imports a module of a higher folder, and no two modules import
each other, directly or around a cycle. Imports inside functions count too: a lazy import is
still a dependency. Modules and functions stay small, no code outside backends/ branches on a
backend's name, and every test file is where tests/README.md says.

`python tests/system/test_architecture.py` prints the graph, floor by floor, then folder by folder; with
`--table`, docs/architecture.md's table of floors and folders (which a test holds to the graph).
"""
from __future__ import annotations

import ast
import functools
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # run as a script too: no conftest
PACKAGES = {"commbench": ROOT / "commbench", "commbench.analysis": ROOT / "analysis",
            "commbench.proxies": ROOT / "proxies"}

# 1 core data, 2 pure models and workloads, 3 runtime, 4 commands and readers of results.
FLOORS = {
    1: ["commbench", "commbench.sizes", "commbench.collectives", "commbench.schedule", "commbench.algorithms",
        "commbench.algorithm_builds",
        "commbench.tuning", "commbench.alltoall", "commbench.topology", "commbench.results", "commbench.environment",
        "commbench.files", "commbench.analysis", "commbench.eta", "commbench.lifetime", "commbench.launchers",
        "commbench.proxies", "commbench.results*", "commbench.errors", "commbench.splits",
        "commbench.backends.registry"],
    2: ["commbench.costmodel*", "commbench.step_terms",
        "commbench.analysis.fit", "commbench.analysis.fit_points", "commbench.analysis.fit_step_terms",
        "commbench.analysis.hosts",
        "commbench.analysis.check",
        "commbench.analysis.check_layout",
        "commbench.analysis.scaling", "commbench.analysis.intervals",
        "commbench.analysis.stragglers", "commbench.analysis.calibration", "commbench.analysis.corpus*",
        "commbench.analysis.stragglers_report",
        "commbench.analysis.scale_terms", "commbench.analysis.provenance",
        "commbench.analysis.predict", "commbench.analysis.predict_scaling", "commbench.analysis.predict_layout",
        "commbench.analysis.layout_search",
        "commbench.proxies.profile", "commbench.proxies.profile_types",
        "commbench.proxies.buckets", "commbench.proxies.timeline", "commbench.proxies.catalog",
        "commbench.proxies.setups", "commbench.proxies.setup_steps", "commbench.proxies.comm_plan",
        "commbench.proxies.models*", "commbench.proxies.units", "commbench.proxies.transformer",
        "commbench.proxies.layouts", "commbench.proxies.layouts.memory", "commbench.proxies.layouts.parallelism",
        "commbench.proxies.layouts.pipeline", "commbench.proxies.layouts.calls", "commbench.proxies.traces",
        "commbench.proxies.traces.calls", "commbench.proxies.traces.execution_trace", "commbench.proxies.traces.files",
        "commbench.proxies.traces.chrome_json", "commbench.proxies.traces.nccl_log",
        "commbench.proxies.traces.extracted_profile", "commbench.proxies.traces.torch_profiler",
        "commbench.analysis.predict_trace",
        "commbench.proxies.layouts.stage_share", "commbench.proxies.layouts.layer_ops",
        "commbench.proxies.layouts.pieces"],
    3: ["commbench.launch", "commbench.emulate*", "commbench.cluster_state", "commbench.job", "commbench.bench*",
        "commbench.table", "commbench.telemetry", "commbench.sweep_config", "commbench.point_timing",
        "commbench.backends*", "commbench.proxies.config", "commbench.proxies.context", "commbench.proxies.replay",
        "commbench.proxies.train", "commbench.proxies.train_setups", "commbench.proxies.run",
        "commbench.proxies.steps", "commbench.proxies.channels", "commbench.proxies.clocks",
        "commbench.proxies.extract", "commbench.proxies.layouts.train*", "commbench.analysis.predict_proxy",
        "commbench.proxies.traces.replay", "commbench.proxies.layouts.replay",
        "commbench.proxies.layouts.replay_run", "commbench.proxies.layouts.compute",
        "commbench.proxies.operator_timing", "commbench.proxies.compute_measure", "commbench.proxies.compute_cache",
        "commbench.proxies.layouts.memory_measure"],
    4: ["commbench.cli", "commbench.__main__", "commbench.commands*", "commbench.analysis.report",
        "commbench.analysis.report_steps", "commbench.analysis.report_tables", "commbench.analysis.report_compare",
        "commbench.analysis.compare", "commbench.analysis.report_timeline"],
}

# The folders, bottom to top: a module imports its own folder or the folders below it, never above.
# commands is commbench/commands/ with cli.py and __main__.py; commbench is the rest of commbench/.
FOLDERS = ("commbench", "proxies", "analysis", "commands")


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


@functools.cache
def parsed(source: str) -> ast.Module:
    """The syntax tree of `source`, parsed once per run: several checks walk every module (read only)."""
    return ast.parse(source)


def import_graph() -> dict[str, set[str]]:
    """module -> the commbench modules it imports (anywhere in its body); a fresh copy for each caller."""
    return {name: set(targets) for name, targets in _import_graph().items()}


@functools.cache
def _import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, path in known.items():
        targets = set()
        for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in known
                               else node.module for alias in node.names)
                if node.module in known and node.module != name and name.startswith(node.module + "."):
                    targets.add(node.module)  # a module importing through its own package runs the package first
        graph[name] = {t for t in targets if t in known and t != name}
    return graph


def floor_of(module: str) -> int | None:
    for floor, patterns in FLOORS.items():
        for pattern in patterns:
            if module == pattern or (pattern.endswith("*") and module.startswith(pattern[:-1])):
                return floor
    return None


def folder_of(module: str) -> str:
    """The folder a module lives in, by the names of FOLDERS."""
    if module in ("commbench.cli", "commbench.__main__", "commbench.commands") or \
            module.startswith("commbench.commands."):
        return "commands"
    for folder in ("analysis", "proxies"):
        if module == f"commbench.{folder}" or module.startswith(f"commbench.{folder}."):
            return folder
    return "commbench"


def upward_floors(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor than the importer's."""
    return [f"{m} (floor {floor_of(m)}) imports {t} (floor {floor_of(t)})"
            for m, targets in sorted(graph.items()) for t in sorted(targets) if floor_of(t) > floor_of(m)]


def upward_folders(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a folder above the importer's."""
    return [f"{m} ({folder_of(m)}/) imports {t} ({folder_of(t)}/)"
            for m, targets in sorted(graph.items()) for t in sorted(targets)
            if FOLDERS.index(folder_of(t)) > FOLDERS.index(folder_of(m))]


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
    assert upward_floors(import_graph()) == []


def test_imports_only_run_down_the_folders():
    assert upward_folders(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_cost_model_is_one_package_below_the_predictions():
    """Every cost of a call is worked out in commbench/costmodel/ (floor 2), which imports nothing of analysis/ or
    proxies/: a walk of --hw goes down into it and does not climb back (issue 33)."""
    graph = import_graph()
    package = [m for m in graph if m == "commbench.costmodel" or m.startswith("commbench.costmodel.")]
    assert {"commbench.costmodel.hardware", "commbench.costmodel.rounds", "commbench.costmodel.nccl_tuning",
            "commbench.costmodel.call"} <= set(package)
    assert {floor_of(m) for m in package} == {2}
    assert [f"{m} imports {t}" for m in sorted(package) for t in sorted(graph[m])
            if folder_of(t) in ("analysis", "proxies")] == []
    assert "commbench.analysis.nccl_tuning" not in graph  # moved into the package


def test_the_checks_can_fail():
    """The checkers see an upward import, between floors or folders, and a cycle when there is one."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert floor_of("commbench.cli") == 4 and floor_of("commbench.backends.shm") == 3
    assert upward_floors({"commbench.sizes": {"commbench.job"}, "commbench.job": {"commbench.sizes"}}) == [
        "commbench.sizes (floor 1) imports commbench.job (floor 3)"]
    assert [folder_of(m) for m in ("commbench", "commbench.backends.shm", "commbench.proxies.replay",
                                   "commbench.analysis", "commbench.cli", "commbench.commands.sweep")] == [
        "commbench", "commbench", "proxies", "analysis", "commands", "commands"]
    # the arrow the folder check was written for: proxies/run costing a step with analysis/scaling went down a
    # floor (3 to 2), so only the folder check sees it go up a folder
    upward = {"commbench.proxies.run": {"commbench.analysis.scaling", "commbench.proxies.profile"},
              "commbench.analysis.scaling": {"commbench.proxies.profile"}, "commbench.proxies.profile": set()}
    assert upward_floors(upward) == []
    assert upward_folders(upward) == ["commbench.proxies.run (proxies/) imports commbench.analysis.scaling (analysis/)"]


def print_folders(graph: dict[str, set[str]]) -> None:
    """Each folder, top to bottom: the folders it imports, and its modules floor by floor."""
    print(f"folders, bottom to top: {' < '.join(FOLDERS)}")
    for folder in reversed(FOLDERS):
        members = sorted(m for m in graph if folder_of(m) == folder)
        imported = sorted({folder_of(t) for m in members for t in graph[m]} - {folder}, key=FOLDERS.index)
        print(f"folder {folder} -> {', '.join(imported) or '-'}")
        for floor in sorted({floor_of(m) for m in members}, reverse=True):
            names = [m.replace("commbench.", "") for m in members if floor_of(m) == floor]
            print(f"  floor {floor}: {', '.join(names)}")


FLOOR_NAMES = {4: "4 commands, readers", 3: "3 runtime", 2: "2 pure", 1: "1 core data"}
FOLDER_HEADS = {"commbench": "commbench/", "proxies": "proxies/", "analysis": "analysis/", "commands": "commands"}
TABLE_START = "<!-- the floors and folders: `python tests/system/test_architecture.py --table`; checked by the test -->"
TABLE_END = "<!-- end of the generated table -->"


def _short(module: str) -> str:
    """A module's name inside its folder, sub-packages as paths: backends/cuda/sched, costmodel/call."""
    for prefix in ("commbench.analysis.", "commbench.proxies.", "commbench.commands.", "commbench."):
        if module.startswith(prefix):
            return module[len(prefix):].replace(".", "/")
    return module.replace("commbench", "commbench/__init__") if module == "commbench" else module


def floor_table(graph: dict[str, set[str]]) -> str:
    """docs/architecture.md's table of floors by folders, every module in its cell, from the graph itself."""
    lines = ["| floor | " + " | ".join(FOLDER_HEADS[f] for f in FOLDERS) + " |", "|---" * (len(FOLDERS) + 1) + "|"]
    for floor in sorted(FLOORS, reverse=True):
        cells = [", ".join(sorted(_short(m) for m in graph if floor_of(m) == floor and folder_of(m) == folder
                                  and m not in ("commbench", "commbench.analysis", "commbench.proxies",
                                                "commbench.commands")))
                 for folder in FOLDERS]
        lines.append(f"| {FLOOR_NAMES[floor]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def test_the_docs_table_of_floors_is_the_graphs():
    """docs/architecture.md's table between its markers is what floor_table prints: it cannot drift."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert TABLE_START in text and TABLE_END in text, "docs/architecture.md lost its table's markers"
    shown = text.split(TABLE_START, 1)[1].split(TABLE_END, 1)[0].strip()
    assert shown == floor_table(import_graph()), \
        "docs/architecture.md's table differs from the graph: paste `python tests/system/test_architecture.py --table`"


def _backend_names() -> set[str]:
    """Every name a record's or option's `backend` can hold: the registry's and the cost model's."""
    from commbench.backends.registry import BACKENDS, MODEL

    return {*BACKENDS, MODEL}


def _names_backend(node: ast.AST) -> bool:
    """The expression is a backend (its name, or a record's or config's `backend` field): `backend`,
    `cfg.backend`, `self.backend.name`, `r["backend"]`, `r.get("backend")`; not `self.backend.device`."""
    if isinstance(node, ast.Attribute) and node.attr == "name":
        return _names_backend(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        return _names_backend(node.args[0])
    if isinstance(node, ast.Subscript):
        return _names_backend(node.slice)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
        node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
    return "backend" in name.lower()


def _backend_literal(node: ast.AST, names: set[str]) -> bool:
    """A string literal naming a backend, or a tuple, list or set of string literals one of which does."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        return len(strings) == len(node.elts) and any(s in names for s in strings)
    return isinstance(node, ast.Constant) and node.value in names


def backend_comparisons(source: str, names: set[str]) -> list[int]:
    """Lines of `source` that compare a backend to a backend's name (==, !=, in, not in, is)."""
    found = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for a, b in zip(operands, operands[1:]):
                if (_backend_literal(a, names) and _names_backend(b)) or (_backend_literal(b, names) and
                                                                          _names_backend(a)):
                    found.append(node.lineno)
    return sorted(set(found))


def test_no_backend_name_compared_outside_backends():
    """Outside commbench/backends/ nothing branches on a backend's name: a command asks the backend class's
    capabilities, a reader the record's (backends.registry.record_capabilities)."""
    names = _backend_names()
    snippet = ('if r.get("backend") not in ("sim", "model"): pass\nok = cfg.device == "cuda"\n'
               'if backend.name == "torch" or record["backend"] in ["shm"]: pass\nx = self.backend.device == "cuda"\n')
    assert backend_comparisons(snippet, names) == [1, 3]  # the check can fail; a device is not a backend
    offenders = [f"{path.relative_to(ROOT)}:{line}" for module, path in modules().items()
                 if not module.startswith("commbench.backends")
                 for line in backend_comparisons(path.read_text(encoding="utf-8"), names)]
    assert offenders == []


def _names_setup(node: ast.AST) -> bool:
    """The expression is a setup's name: `name`, `setup`, `choice.name`, `self.name`, `r["setup"]`, ..."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
        return _names_setup(node.args[0])
    if isinstance(node, ast.Subscript):
        return _names_setup(node.slice)
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else \
        node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else ""
    return name.lower() in ("name", "setup", "setup_name")


def setup_facts_outside(source: str, names: set[str]) -> list[int]:
    """Lines of `source` that compare a setup's name to a literal setup name, or key a table by two or more
    setup names (a setup's fact kept outside its entry)."""
    found = []
    for node in ast.walk(parsed(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for a, b in zip(operands, operands[1:]):
                if (_backend_literal(a, names) and _names_setup(b)) or (_backend_literal(b, names) and
                                                                        _names_setup(a)):
                    found.append(node.lineno)
        elif isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            if sum(k in names for k in keys) >= 2:
                found.append(node.lineno)
    return sorted(set(found))


def test_no_setup_fact_outside_the_setup_table():
    """Every fact about a setup lives in its entry (proxies/setups.py): no code elsewhere compares a setup's name
    or keeps a table keyed by setup names (a comm hook, a reshard flag, what trains instead)."""
    from commbench.proxies.setups import SETUPS

    names = set(SETUPS)
    snippet = ('if self.name == "horovod": pass\nHOOKS = {"ddp-fp16": "a", "ddp-bf16": "b"}\n'
               'ok = kind == "ddp"\nif choice.name in ("zero1", "zero2"): pass\n')
    assert setup_facts_outside(snippet, names) == [1, 2, 4]  # the check can fail; trains_as is not a setup
    offenders = [f"{path.relative_to(ROOT)}:{line}" for module, path in modules().items()
                 if module != "commbench.proxies.setups"
                 for line in setup_facts_outside(path.read_text(encoding="utf-8"), names)]
    assert offenders == []


def module_strings(source: str, names: set[str]) -> list[int]:
    """Lines of `source` whose string literals (docstrings aside) name one of the modules `names`, as a
    module or as a "module:attribute" reference: a dependency the import graph cannot see."""
    tree = parsed(source)
    docstrings = {id(body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  for body in [node.body] if body and isinstance(body[0], ast.Expr)}
    return sorted({node.lineno for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                   and re.fullmatch(r"[\w.]+(:[\w.]+)?", node.value) and node.value.partition(":")[0] in names})


def test_the_job_frame_names_no_module():
    """job.py imports none of the jobs it runs and names none by string: each job is declared beside its work
    (a job.Job) and handed to it, so the import graph shows every arrow (issue 33)."""
    names = set(modules())
    snippet = ('"""Run commbench.bench:run_sweep."""\nJOBS = {"sweep": "commbench.bench:run_sweep"}\n'
               'x = f"{__name__}:SWEEP_JOB"\nspawn("commbench.job")\nsay("commbench: sweep")\n')
    assert module_strings(snippet, names) == [2, 4]  # the check can fail; a docstring and a message are not names
    assert module_strings((ROOT / "commbench" / "job.py").read_text(encoding="utf-8"), names) == []
    assert not {t for t in import_graph()["commbench.job"] if floor_of(t) >= floor_of("commbench.job")} - {
        "commbench.launch", "commbench.lifetime", "commbench.emulate", "commbench.emulated_run"}


# ---------------------------------------------------------------- room sizes

MAX_MODULE_LINES = 380
MAX_FUNCTION_LINES = 50
SIZED = ("commbench", "analysis", "proxies", "benchmarks")  # the package's folders and the benchmark scripts


def oversized(folders=SIZED, root: Path = ROOT) -> list[str]:
    """Modules over MAX_MODULE_LINES lines and functions over MAX_FUNCTION_LINES (decorators excluded,
    docstring included), as 'path: what (lines)'."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            where = path.relative_to(root)
            if len(text.splitlines()) > MAX_MODULE_LINES:
                found.append(f"{where}: module ({len(text.splitlines())} lines)")
            for node in ast.walk(parsed(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found.append(f"{where}:{node.lineno}: {node.name} ({lines} lines)")
    return found


def test_modules_and_functions_stay_small():
    assert oversized() == []


def test_the_size_check_can_fail(tmp_path):
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg" / "big.py").write_text(f"def long():\n{body}\n" + "\n" * MAX_MODULE_LINES)
    lines = 1 + MAX_FUNCTION_LINES + MAX_MODULE_LINES
    assert oversized(("pkg",), tmp_path) == [f"pkg/big.py: module ({lines} lines)", "pkg/big.py:1: long (51 lines)"]


MAX_POSITIONAL = 6  # issue 46: a step prediction's 16 parameters travelled by position through five layers
POSITIONAL_CHECKED = ("analysis", "proxies")
# nn.Module constructors that keep the argument order of the published model code they rebuild (its users call
# them as that code does): TorchBench's speech_transformer and Transformer-XL
POSITIONAL_EXEMPT = ("proxies/models/",)
# signatures another library calls by position: torch's FlopCounter passes aten.convolution_backward's arguments
# to a registered formula; transformers' AttentionInterface calls an attention function with its own order
POSITIONAL_CALLED_BY_OTHERS = {"_conv_backward_flops", "attention"}


def long_positional_lists(folders=POSITIONAL_CHECKED, root: Path = ROOT) -> list[str]:
    """Functions taking more than MAX_POSITIONAL parameters by position (self and cls aside), as
    'path:line: name (n)': past that many, the rest are keyword-only (`*`) or one value."""
    found = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            where = path.relative_to(root).as_posix()
            if where.startswith(POSITIONAL_EXEMPT):
                continue
            for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names = [a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")]
                    if len(names) > MAX_POSITIONAL and node.name not in POSITIONAL_CALLED_BY_OTHERS:
                        found.append(f"{where}:{node.lineno}: {node.name} ({len(names)})")
    return found


def test_no_long_positional_parameter_lists():
    assert long_positional_lists() == []


def test_the_positional_check_can_fail(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "wide.py").write_text("def wide(a, b, c, d, e, f, g):\n    pass\n\n\n"
                                              "def named(a, b, c, d, e, f, *, g):\n    pass\n")
    assert long_positional_lists(("pkg",), tmp_path) == ["pkg/wide.py:1: wide (7)"]


# ---------------------------------------------------------------- where the tests are (tests/README.md)

TESTS = ROOT / "tests"
UNIT_FOLDERS = {"commbench": ROOT / "commbench", "backends": ROOT / "commbench" / "backends",
                "backends/cuda": ROOT / "commbench" / "backends" / "cuda",
                "backends/shm": ROOT / "commbench" / "backends" / "shm",
                "costmodel": ROOT / "commbench" / "costmodel",
                "analysis": ROOT / "analysis", "analysis/corpus": ROOT / "analysis" / "corpus",
                "proxies": ROOT / "proxies",
                "proxies/layouts": ROOT / "proxies" / "layouts",
                "proxies/layouts/train": ROOT / "proxies" / "layouts" / "train",
                "proxies/traces": ROOT / "proxies" / "traces"}  # tests/unit/<key>/ -> its modules
# A folder's names tested under another key: commands/, or a subfolder's own key (unit/costmodel/, unit/backends/cuda/).
TESTED_ELSEWHERE = {"commbench": {"cli", "__main__", "commands", "backends", "costmodel"}, "backends": {"cuda", "shm"},
                    "analysis": {"corpus"}, "proxies": {"layouts", "traces"}, "proxies/layouts": {"train"}}


def _names_in(folder: Path) -> set[str]:
    """The modules and subpackages of a source folder, as a test file names them."""
    return ({p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
            | {d.name for d in folder.iterdir() if (d / "__init__.py").is_file()})


def _named_after(stem: str, names: set[str]) -> bool:
    """test_<name>.py or test_<name>_<aspect>.py for one of `names`."""
    rest = stem.removeprefix("test_")
    return any(rest == n or rest.startswith(n + "_") for n in names)


def misplaced_tests(tests: Path = TESTS, commands: set[str] | None = None) -> list[str]:
    """Test files not where tests/README.md says: unit/<folder>/test_<module>[_aspect].py for a module of
    that folder, commands/test_<command>[_aspect].py for a command (or `cli`), system/ for the rest."""
    if commands is None:
        from commbench.cli import cli

        commands = {name.replace("-", "_") for name in cli.commands} | {"cli"}
    found = [f"{p.relative_to(tests)}: not in unit/, commands/ or system/" for p in tests.glob("test_*.py")]
    for key, folder in UNIT_FOLDERS.items():
        names = _names_in(folder)
        found += [f"unit/{key}/{p.name}: names no module of {folder.relative_to(ROOT)}/"
                  for p in sorted((tests / "unit" / key).glob("test_*.py")) if not _named_after(p.stem, names)]
    found += [f"commands/{p.name}: names no command" for p in sorted((tests / "commands").glob("test_*.py"))
              if not _named_after(p.stem, commands)]
    extra = {d.relative_to(tests / "unit").as_posix() for d in (tests / "unit").rglob("*")
             if d.is_dir() and "__pycache__" not in d.parts} - set(UNIT_FOLDERS)
    return found + [f"unit/{name}/: no such source folder" for name in sorted(extra)]


def test_no_two_test_files_share_a_name():
    """pytest imports test files by their basename (rootdir, no packages): two of one name stop the whole
    collection ("import file mismatch"), as tests/unit/commbench/test_launchers.py beside tests/system's did."""
    seen: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        if not (path.parent / "__init__.py").exists():  # in a package it is imported by its dotted path
            seen.setdefault(path.name, []).append(str(path.relative_to(TESTS)))
    assert [paths for paths in seen.values() if len(paths) > 1] == []


def test_tests_are_found_by_name():
    assert misplaced_tests() == []


def test_the_test_check_can_fail(tmp_path):
    for folder in ("unit/commbench", "unit/backends", "unit/analysis", "unit/proxies", "unit/nowhere", "commands"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("test_flat.py", "unit/commbench/test_bench_x.py", "unit/commbench/test_benchmark.py",
                 "commands/test_sweep.py", "commands/test_swept.py"):
        (tmp_path / name).write_text("")
    assert misplaced_tests(tmp_path, {"sweep", "cli"}) == [
        "test_flat.py: not in unit/, commands/ or system/", "unit/commbench/test_benchmark.py: names no module of "
        "commbench/", "commands/test_swept.py: names no command", "unit/nowhere/: no such source folder"]


def test_the_test_check_sees_a_wing(tmp_path):
    """A backends wing's tests are found by the wing's module names, and a folder under unit/backends/ that is no
    wing is reported, as a top-level one is."""
    for folder in ("unit/backends/cuda", "unit/backends/nowhere", "commands"):
        (tmp_path / folder).mkdir(parents=True)
    for name in ("unit/backends/cuda/test_sched_x.py", "unit/backends/cuda/test_shm.py", "unit/backends/test_cuda.py"):
        (tmp_path / name).write_text("")
    assert misplaced_tests(tmp_path, {"cli"}) == [
        "unit/backends/cuda/test_shm.py: names no module of commbench/backends/cuda/",
        "unit/backends/nowhere/: no such source folder"]


# ---------------------------------------------------------------- every module has its tests (the other direction)

# Modules with no test file of their own name, each with where its behaviour is tested instead, or that it is not.
# The check fails on a module missing from here without a test file, and on an entry that has come to have one or
# no longer exists, so the list only shrinks honestly. Keys as folder/module: the unit folders' keys, or commands/.
UNTESTED_BY_NAME = {
    # the emulated cluster needs root and network namespaces: tests/system/test_emulate*.py (skipped without root)
    "commbench/emulate": "system/test_emulate.py", "commbench/emulated_run": "system/test_emulate.py",
    "commands/emulate": "system/test_emulate.py",
    "commands/helpers/hw_option": "commands/test_cli_hw_option.py (every command's --hw)",
    "commbench/bench_point": "unit/commbench/test_point_timing.py, test_table_stats.py, test_bench_*.py (each point)",
    "commbench/algorithm_builds": "unit/commbench/test_algorithms.py (each builder and closed form via the table)",
    "commands/nccltests_flags": "commands/test_nccl_tests.py (every flag), test_cli_newcomer.py (sweep's letters)",
    # read through the readers that use it: every trace and profile reader's tests, system/test_inputs.py
    "commbench/files": "unit/proxies/test_trace_*.py, system/test_inputs.py (devices, FIFOs, sizes)",
    # the topology's links and levels are pinned by the cost model's and the algorithms' exact-value tests
    "commbench/topology": "unit/costmodel/test_rounds*.py, test_call.py, unit/commbench/test_algorithms.py",
    # the backend interface and its shared parts, exercised by every backend's runs
    "backends/base": "unit/commbench/test_sweep_config.py (BackendConfig), test_bench_*.py",
    "backends/schedule_base": "unit/commbench/test_bench_schedules.py (every schedule backend)",
    "backends/rank_frame": "every job's ranks: unit/commbench/test_bench_*.py, commands/test_proxy.py",
    "backends/control": "unit/backends/test_dist_group.py (gloo's), unit/backends/cuda/test_sched_fake_gpu.py",
    "backends/bfloat16": "unit/commbench/test_bench_schedules.py, test_collectives.py (bfloat16 results checked)",
    # backends run by the harness's and the commands' tests, by name (--backend)
    "backends/torch_dist": "commands/test_sweep.py, test_proxy.py (the default backend)",
    "backends/sim": "unit/commbench/test_bench_schedules.py, unit/analysis/test_fit_round_trip.py",
    "backends/hybrid": "unit/commbench/test_bench_schedules.py, unit/backends/shm/test_waits.py",
    "backends/shm/backend": "unit/commbench/test_bench_schedules.py, unit/backends/shm/test_*.py (ShmBackend's runs)",
    # the cuda wing's GPU parts: run only where a GPU is (tests/unit/backends/cuda/test_sched.py, test_nccl.py skip
    # without one), and without one through the stand-in CuPy (test_*fake_gpu.py) and the host build (test_host.py)
    "backends/cuda/device": "unit/backends/cuda/test_sched*.py, test_nccl*.py",
    "backends/cuda/ipc": "unit/backends/cuda/test_sched.py (GPU), test_sched_fake_gpu.py",
    "backends/cuda/checks": "unit/backends/cuda/test_host.py, commands/test_selftest.py",
    # train --layout's rank body: trained end to end by its command's test
    "proxies/layouts/train/run": "commands/test_train_layout.py",
    "proxies/layouts/replay_run": "commands/test_proxy_layout.py",
    "analysis/report_tables": "unit/analysis/test_report_steps.py (index_lines of step_rows' rows)",
    # analysis/ pieces pinned through the analyses that use them
    "analysis/predict_proxy": "commands/test_proxy.py (--backend sim and --nodes beyond the job)",
    "analysis/predict_scaling": "unit/analysis/test_scaling.py, test_calibration.py, test_intervals.py",
    "analysis/provenance": "unit/analysis/test_intervals.py, test_predict_interval.py",
    "analysis/corpus/published": "unit/analysis/test_calibration.py",
    "analysis/scale_terms": "unit/analysis/test_calibration.py, test_stragglers.py",
    # proxies/: the replay's and training's runtime, tested by the proxy, train and replay commands
    "proxies/config": "commands/test_proxy*.py, unit/commbench/test_sweep_config.py (RanksConfig)",
    "proxies/context": "commands/test_proxy.py (headers, steps, summaries), system/test_faults.py (after faults)",
    "proxies/run": "commands/test_proxy.py (--validate, profiles)",
    "proxies/steps": "unit/commbench/test_results.py, commands/test_proxy.py",
    "proxies/channels": "unit/proxies/test_timeline.py, system/test_faults.py",
    "proxies/clocks": "unit/proxies/test_timeline.py, system/test_faults.py",
    "proxies/comm_plan": "unit/proxies/test_setups.py, traces/test_calls_traced.py, "
                         "unit/analysis/test_predict_layout.py",
    "proxies/setup_steps": "unit/proxies/test_setups_torch.py, unit/proxies/layouts/test_replay_layout.py",
    "proxies/train": "commands/test_proxy.py (train, --validate), unit/proxies/test_setups_torch.py",
    "proxies/train_setups": "unit/proxies/test_setups_torch.py",
    "proxies/catalog": "unit/proxies/test_profile_shipped.py, test_units.py, system/test_security.py",
    "proxies/traces/replay": "commands/test_replay.py, system/test_emulate_replay.py",
    "proxies/traces/files": "unit/proxies/traces/test_*.py, unit/analysis/test_predict_trace.py",
    "proxies/traces/chrome_json": "unit/proxies/traces/test_torch_profiler.py",
    "proxies/layouts/stage_share": "unit/proxies/layouts/test_replay_layout.py, unit/analysis/test_predict_layout.py",
    "proxies/layouts/train/parts": "unit/proxies/layouts/train/test_local_layouts.py (one 4-rank job trains every "
                                   "layout)",
    "proxies/layouts/train/build": "unit/proxies/layouts/train/test_local_layouts.py, commands/test_train_layout.py",
    "proxies/layouts/train/model": "unit/proxies/layouts/train/test_local_layouts.py",
    "proxies/layouts/train/moe": "unit/proxies/layouts/train/test_local_layouts.py",
    "proxies/layouts/train/ring": "unit/proxies/layouts/train/test_local_layouts.py",
    "proxies/layouts/train/trace": "unit/proxies/layouts/train/test_local_layouts.py",
    # commands/helpers/: what several commands share, tested through them; commands tested under other names
    "commands/__main__": "commands/test_cli.py (python -m commbench)",
    "commands/helpers/common": "commands/test_cli*.py, system/test_inputs.py (outputs, one-line faults)",
    "commands/helpers/options": "commands/test_cli_option_limits.py, system/test_inputs.py",
    "commands/helpers/ranks_options": "commands/test_proxy_options.py (the base of sweep's and proxy's options)",
    "commands/scale": "commands/test_cli_layout.py, test_sweep_layout.py",
    "commands/helpers/setup_flags": "commands/test_proxy_setups.py, test_cli_exit_codes.py",
    "commands/helpers/backend_options": "unit/commbench/test_sweep_config.py (the ranks get what the backend settled)",
    "commands/predict_layouts": "commands/test_predict_scaling_layouts.py",
    "commands/proxy_plan": "commands/test_proxy*.py, test_cli_exit_codes.py",
    "commands/replay_table": "commands/test_replay.py",
    "commands/compare": "unit/analysis/test_compare.py, test_report_compare.py",
}
COMMANDS_FOLDER = ROOT / "commbench" / "commands"


def _command_names_by_module() -> dict[str, set[str]]:
    """commands/<module> -> the commands it defines, as test files name them (`nccl-tests`: nccl_tests)."""
    from commbench.cli import cli

    found: dict[str, set[str]] = {}
    for name, command in cli.commands.items():
        callback = command.callback or next(iter(getattr(command, "commands", {}).values())).callback
        found.setdefault(callback.__module__.rpartition(".")[2], set()).add(name.replace("-", "_"))
    return found


def modules_without_tests(tests: Path = TESTS, allowed: dict | None = None, commands: dict | None = None) -> list[str]:
    """Modules with no test file of their name (unit/<folder>/test_<module>[_aspect].py; for commands/, and cli.py and
    __main__.py, commands/test_<module or its command>[_aspect].py) and not in UNTESTED_BY_NAME; and entries there
    that have a test file of their name or name no module."""
    allowed = UNTESTED_BY_NAME if allowed is None else allowed
    commands = _command_names_by_module() if commands is None else commands
    wanted = {f"{key}/{name}": ({name}, tests / "unit" / key) for key, folder in UNIT_FOLDERS.items()
              for name in _names_in(folder) - TESTED_ELSEWHERE.get(key, set())}
    wanted |= {f"commands/{name}": ({name} | commands.get(name, set()), tests / "commands")
               for name in _names_in(COMMANDS_FOLDER) - {"helpers"} | {"cli", "__main__"}}
    wanted |= {f"commands/helpers/{name}": ({name}, tests / "commands")
               for name in _names_in(COMMANDS_FOLDER / "helpers")}
    tested = {key for key, (names, folder) in wanted.items()
              if any(_named_after(p.stem, names) for p in folder.glob("test_*.py"))}
    return ([f"{key}: no test file of its name; write one, or say in UNTESTED_BY_NAME where it is tested"
             for key in sorted(set(wanted) - tested - set(allowed))] +
            [f"{key}: in UNTESTED_BY_NAME but {'has a test file of its name' if key in tested else 'no such module'}"
             for key in sorted(set(allowed) & tested | set(allowed) - set(wanted))])


def test_every_module_has_a_test_file_of_its_name_or_says_where_it_is_tested():
    assert modules_without_tests() == []


def test_the_module_check_can_fail(tmp_path):
    (tmp_path / "unit" / "commbench").mkdir(parents=True)
    (tmp_path / "commands").mkdir()
    (tmp_path / "unit" / "commbench" / "test_sizes.py").write_text("")
    found = modules_without_tests(tmp_path, {"commbench/sizes": "x", "commbench/nowhere": "y"}, {})
    assert "commbench/sizes: in UNTESTED_BY_NAME but has a test file of its name" in found
    assert "commbench/nowhere: in UNTESTED_BY_NAME but no such module" in found
    assert "commbench/collectives: no test file of its name; write one, or say in UNTESTED_BY_NAME where it is " \
           "tested" in found




# ---------------------------------------------------------------- benchmarks' own imports

def _top_level_names(tree: ast.Module) -> set[str]:
    """What a module defines at its top level: functions, classes, assigned names and imported names."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def unresolved_script_imports(folder: Path = ROOT / "benchmarks") -> list[str]:
    """`from SCRIPT import NAME` between the benchmark scripts where SCRIPT defines no NAME: a helper moved out of
    a shared script left two scripts that no longer imported (no test runs them)."""
    trees = {p.stem: ast.parse(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.py"))}
    defined = {stem: _top_level_names(tree) for stem, tree in trees.items()}
    return [f"{stem}.py:{node.lineno}: {node.module} has no {alias.name}"
            for stem, tree in trees.items() for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in defined
            for alias in node.names if alias.name != "*" and alias.name not in defined[node.module]]


def test_the_benchmark_scripts_import_what_their_shared_scripts_define():
    assert unresolved_script_imports() == []


def test_the_script_import_check_can_fail(tmp_path):
    (tmp_path / "shared.py").write_text("import os\nKEPT = 1\n\ndef helper():\n    pass\n")
    (tmp_path / "script.py").write_text("from shared import KEPT, helper, os\nfrom shared import Moved\n")
    assert unresolved_script_imports(tmp_path) == ["script.py:2: shared has no Moved"]


if __name__ == "__main__":
    graph = import_graph()
    if sys.argv[1:] == ["--table"]:
        print(floor_table(graph))
        sys.exit(0)
    for floor in sorted(FLOORS, reverse=True):
        print(f"floor {floor}")
        for module in sorted(m for m in graph if floor_of(m) == floor):
            print(f"  {module} -> {', '.join(sorted(t.replace('commbench.', '') for t in graph[module])) or '-'}")
    print_folders(graph)
    for offence in upward_floors(graph) + upward_folders(graph):
        print(f"UPWARD: {offence}")
    sys.exit(1 if cycles(graph) or upward_floors(graph) or upward_folders(graph) else 0)

