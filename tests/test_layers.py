"""Layers: the library's ranks (docs/architecture.md, "The map"): each unit imports only units of lower rank;
library code never imports the tooling, nothing outside dledger/ reaches into dledger's engine, and the chaos runs
and the audit stay independent of each other.

Every .py file is parsed with `ast` (nothing is imported), so a violation is reported as file:line and module.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("dledger", "broker", "namesrv", "serverkit", "dashboard", "cli", "rocketraft")
TOOLING = ("devkit", "bench", "jepsen_tests", "audit", "tests")
CLI = "cli/"  # the command line: may import tooling inside a subcommand's function
DLEDGER_OWN_TESTS = "tests/dledger/"  # white-box tests that pin the pysyncobj seam (test_raft_seam.py)
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}

# Known violations being fixed elsewhere (none now). An entry that no longer occurs fails the test, so it is
# deleted as soon as the import is gone.
PENDING: set[tuple[str, str]] = set()


@dataclass(frozen=True)
class Import:
    path: str  # relative to the repository root
    line: int
    module: str  # absolute dotted name; `from a import b` gives a.b as well as a
    in_function: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line} imports {self.module}"


class _Imports(ast.NodeVisitor):
    def __init__(self, path: str, package: str):
        self.path, self.package = path, package
        self.depth = 0
        self.found: list[Import] = []

    def _add(self, node: ast.AST, module: str) -> None:
        self.found.append(Import(self.path, node.lineno, module, self.depth > 0))

    def _function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            parts = self.package.split(".")
            parent = ".".join(parts[:len(parts) - node.level + 1])
            base = f"{parent}.{base}" if base else parent
        self._add(node, base)
        for alias in node.names:
            if alias.name != "*":
                self._add(node, f"{base}.{alias.name}")

    def visit_Call(self, node: ast.Call) -> None:  # importlib.import_module("x") / __import__("x") with a literal
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self._add(node, node.args[0].value)
        self.generic_visit(node)


def imports_of(path: Path, root: Path = ROOT) -> list[Import]:
    relative = path.relative_to(root)
    package = ".".join(relative.parent.parts)
    visitor = _Imports(relative.as_posix(), package)
    visitor.visit(ast.parse(path.read_bytes(), filename=str(path)))
    return visitor.found


def python_files(root: Path = ROOT) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts[:-1]
        if not any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info") for p in parts):
            found.append(path)
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def is_private_dledger(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "dledger" and any(p.startswith("_") and not p.endswith("__") for p in parts[1:])


def all_imports() -> list[Import]:
    return [imp for path in python_files() for imp in imports_of(path)]


def under(imp: Import, *folders: str) -> bool:
    return any(imp.path.startswith(folder.rstrip("/") + "/") for folder in folders)


def report(violations: list[Import]) -> str:
    return "\n".join(sorted({str(v) for v in violations}))


def test_the_scanner_sees_plain_relative_from_lazy_and_dynamic_imports(tmp_path):
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    source = tmp_path / "pkg" / "sub" / "mod.py"
    source.write_text("import devkit.devcluster\nfrom .. import _raft\nfrom .x import y\n"
                      "def f():\n    from bench import harness\n    importlib.import_module('audit.job')\n")
    found = {(i.module, i.in_function) for i in imports_of(source, tmp_path)}
    assert {("devkit.devcluster", False), ("pkg._raft", False), ("pkg.sub.x.y", False), ("bench.harness", True),
            ("audit.job", True)} <= found, found


def test_the_layers_are_checked_over_every_package():
    checked = {p.relative_to(ROOT).parts[0] for p in python_files()}
    assert set(LIBRARY) | set(TOOLING) <= checked, checked


def test_library_code_never_imports_the_tooling_except_the_cli_inside_a_subcommand():
    violations = [imp for imp in all_imports() if under(imp, *LIBRARY) and top(imp.module) in TOOLING
                  and not (under(imp, CLI) and imp.in_function)]
    assert not violations, "library code imports dev/test tooling:\n" + report(violations)


def test_nothing_outside_dledger_imports_pysyncobj_or_a_private_dledger_module():
    found = [imp for imp in all_imports() if not under(imp, "dledger", DLEDGER_OWN_TESTS)
             and (top(imp.module) == "pysyncobj" or is_private_dledger(imp.module))]
    violations = [imp for imp in found if (imp.path, imp.module) not in PENDING]
    assert not violations, "only dledger/ may use pysyncobj and dledger._* modules:\n" + report(violations)
    stale = PENDING - {(imp.path, imp.module) for imp in found}
    assert not stale, f"no longer imported: delete {sorted(stale)} from PENDING in tests/test_layers.py"


# The library's units by rank, lowest first (docs/architecture.md, "The map"); a unit may import its own modules
# and those of lower ranks only: never up, never sideways (broker and namesrv, for instance, share rank 5).
RANKS = {"dledger": 0, "rocketraft.proto": 1, "rocketraft.protocol": 2, "rocketraft.remoting": 3,
         "rocketraft.client": 4, "serverkit": 4, "broker": 5, "namesrv": 5, "dashboard": 5, "cli": 6}


def module_of(path: str) -> str:
    """The module a repository-relative .py path holds ("broker/writes.py" -> "broker.writes")."""
    return path.removesuffix(".py").replace("/", ".")


def library_unit(module: str) -> str | None:
    """The rank table's unit of a library module ("broker.writes" -> "broker"; "rocketraft.aio" and the package's
    own __init__ are the client), None outside the library."""
    parts = module.split(".")
    if parts[0] != "rocketraft":
        return parts[0] if parts[0] in RANKS else None
    second = parts[1] if len(parts) > 1 else "__init__"
    if second in ("aio", "__init__"):
        return "rocketraft.client"
    unit = f"rocketraft.{second}"
    return unit if unit in RANKS else None


def test_every_library_unit_imports_only_lower_ranks():
    violations = []
    for imp in all_imports():
        if not under(imp, *LIBRARY):
            continue
        source = library_unit(module_of(imp.path))
        target = library_unit(imp.module)
        if source and target and source != target and RANKS[target] >= RANKS[source]:
            violations.append(imp)
    assert not violations, "an import up or sideways in the rank table:\n" + report(violations)


def test_every_library_module_has_a_rank():
    unranked = sorted({p.relative_to(ROOT).as_posix() for p in python_files() if p.relative_to(ROOT).parts[0] in
                       LIBRARY and library_unit(module_of(p.relative_to(ROOT).as_posix())) is None})
    assert not unranked, f"modules outside the rank table (add their unit to RANKS and the map): {unranked}"


def test_the_rank_check_sees_an_import_from_storage_up_to_a_server(tmp_path):
    (tmp_path / "dledger").mkdir()
    source = tmp_path / "dledger" / "engine.py"
    source.write_text("from broker import writes\nfrom rocketraft.protocol import wire\n")
    found = [i for i in imports_of(source, tmp_path)
             if RANKS[library_unit(i.module)] >= RANKS[library_unit(module_of(i.path))]]
    assert {library_unit(i.module) for i in found} == {"broker", "rocketraft.protocol"}


def test_the_audit_and_the_chaos_runs_do_not_import_each_other():
    violations = [imp for imp in all_imports() if (under(imp, "audit") and top(imp.module) == "jepsen_tests")
                  or (under(imp, "jepsen_tests") and top(imp.module) == "audit")]
    assert not violations, "audit and jepsen_tests must stay independent:\n" + report(violations)


FIRST_PARTY = (*LIBRARY, "devkit", "bench", "jepsen_tests", "audit")


def _names_bound_in(path: str) -> set[str]:
    """The names a module binds at its top level (defs, classes, assignments, imports, inside top-level if/try/with
    too), read with `ast`; "*" when a module-level __getattr__ can answer any name."""
    bound: set[str] = set()
    statements = list(ast.parse(Path(path).read_bytes()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add("*" if node.name == "__getattr__" else node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            statements += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []) + \
                [s for h in getattr(node, "handlers", []) for s in h.body]
    return bound


def _resolves(module: str) -> bool:
    """The module exists, or it is a name a module that exists binds (`from a import b`, b not a module). For a
    first-party module the name must be bound in it: a module moved out of a package leaves `from . import moved`
    behind, which nothing else sees until the line runs."""
    parts = module.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.util.find_spec(".".join(parts[:cut]))
        except (ModuleNotFoundError, AttributeError, ValueError):  # a name inside a module, not a submodule
            found = None
        if found is not None:
            if cut == len(parts):
                return True
            if cut < len(parts) - 1:
                return False
            if parts[0] not in FIRST_PARTY:
                return True
            if found.origin is None or not found.origin.endswith(".py"):  # a namespace package binds no names
                return False
            bound = _names_bound_in(found.origin)
            return parts[-1] in bound or "*" in bound
    return False


def test_the_import_check_sees_a_name_a_package_no_longer_has():
    assert _resolves("rocketraft.protocol.wire") and _resolves("rocketraft.protocol.wire.Code")
    assert _resolves("rocketraft.Producer")  # answered by the package's __getattr__
    assert not _resolves("rocketraft.protocol.tls_permissive"), "moved to serverkit: `from . import` it fails"
    assert not _resolves("rocketraft.protocol.wire.NoSuchName")


def test_every_first_party_import_names_a_module_that_exists():
    """A module that moved (rocketraft.devcluster -> devkit.devcluster) leaves no import behind, even one inside a
    function that only runs in one test."""
    stale = [imp for imp in all_imports() if top(imp.module) in FIRST_PARTY and not _resolves(imp.module)]
    assert not stale, "imports of modules that do not exist:\n" + report(stale)


def _library_modules() -> dict[str, str]:
    """Every library module by dotted name -> its repository-relative path (a package by its __init__)."""
    found = {}
    for path in python_files():
        relative = path.relative_to(ROOT).as_posix()
        if relative.split("/")[0] in LIBRARY:
            found[module_of(relative).removesuffix(".__init__")] = relative
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the library modules it imports, at module level, inside functions or under TYPE_CHECKING alike
    (`from a import b` counts as a.b when b is a module, else as a)."""
    modules = _library_modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, relative in modules.items():
        for imp in imports_of(ROOT / relative):
            target = imp.module if imp.module in modules else imp.module.rpartition(".")[0]
            if target in modules and target != module and not modules[target].endswith("__init__.py"):
                graph[module].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_cycle_finder_sees_a_cycle_through_a_function_level_import():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_library_module_imports_itself_round_a_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles (a module that cannot be read without the ones that read it):\n" + \
        "\n".join(" <-> ".join(c) for c in found)


LINES_MAX = 700  # a module a reader can hold in mind; generated code (rocketraft/proto) is not counted


def test_no_library_module_is_over_the_line_limit():
    long = {relative: lines for relative in _library_modules().values()
            if not relative.startswith("rocketraft/proto/")
            and (lines := (ROOT / relative).read_text().count("\n")) > LINES_MAX}
    assert not long, f"modules over {LINES_MAX} lines (split them by job): {long}"
