"""dledger's modules as a reader meets them: no import cycle among them, none too long to hold in mind, pysyncobj's
private names spelled only in the seam, and the journal changed only through its own methods.

Everything here reads the source with `ast` (or a regular expression); nothing of dledger is imported. Every import
counts, also one under `if TYPE_CHECKING:` or inside a function: a cycle there is still two modules that each need
the other to be understood.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

DLEDGER = Path(__file__).resolve().parents[2] / "dledger"
LINES_MAX = 700
SEAM = "dledger._pysyncobj_seam"
JOURNAL = "dledger.journal"
# a name Python mangled: `_Class__name` (pysyncobj's privates are `_SyncObj__...`, `_TcpConnection__...`)
MANGLED = re.compile(r"\b_[A-Za-z][A-Za-z0-9]*__[A-Za-z]\w*")
JOURNAL_NAMES = {"journal", "_journal"}


def modules() -> dict[str, Path]:
    """dotted name -> file of every module of the dledger package."""
    out = {}
    for path in sorted(DLEDGER.glob("*.py")):
        out["dledger" if path.stem == "__init__" else f"dledger.{path.stem}"] = path
    return out


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The dledger modules `name` imports anywhere in its file (TYPE_CHECKING blocks and functions included)."""
    package = "dledger"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package if node.level == 1 else package.rsplit(".", node.level - 1)[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from . import x`: the module x
    # the package itself counts only for a name taken from it (every submodule import runs its __init__)
    targets = {m for m in found if m in known and m != name and m != "dledger"}
    if name != "dledger" and any(m == "dledger" for m in found):
        takes_names = False
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 and node.module is None
                                                     or node.level == 0 and node.module == "dledger"):
                takes_names |= any(f"dledger.{alias.name}" not in known for alias in node.names)
        if takes_names:
            targets.add("dledger")
    return targets


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported_modules(name, path, known) for name, path in found.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state:
            cycle = visit(module)
            if cycle:
                return cycle
    return None


def names_the_journal(node: ast.expr) -> bool:
    """`journal`, `self.journal`, `replica._journal`, ...: an expression that is a replica's journal by its name."""
    if isinstance(node, ast.Name):
        return node.id in JOURNAL_NAMES
    return isinstance(node, ast.Attribute) and node.attr in JOURNAL_NAMES


def journal_writes(path: Path) -> list[str]:
    """Lines that set an attribute of the journal (or an item of one of its attributes) from outside it."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and node.args and names_the_journal(node.args[0])):
            out.append(f"{path.name}:{node.lineno}")
        flat = []
        for target in targets:
            flat.extend(target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
        for target in flat:
            if isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and names_the_journal(target.value):
                out.append(f"{path.name}:{node.lineno}")
    return out


def test_no_import_cycle_among_dledger_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "dledger modules import each other: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_a_cycle_hidden_under_type_checking(tmp_path):
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n")
    known = {"dledger.a", "dledger.b"}
    graph = {f"dledger.{m}": imported_modules(f"dledger.{m}", tmp_path / f"{m}.py", known) for m in ("a", "b")}
    assert find_cycle(graph) == ["dledger.a", "dledger.b", "dledger.a"]


def test_no_dledger_module_is_over_700_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > LINES_MAX}
    assert not long, f"dledger modules over {LINES_MAX} lines (split them by job): {long}"


def test_only_the_seam_spells_a_pysyncobj_private_name():
    """Every pysyncobj internal is read, written or called through the seam's RaftCore (whose names the seam checks
    when a replica opens): a mangled name anywhere else would escape that check."""
    found = {name: sorted(set(MANGLED.findall(path.read_text()))) for name, path in modules().items()
             if name != SEAM}
    found = {name: names for name, names in found.items() if names}
    assert not found, f"mangled names outside the seam (use RaftCore): {found}"


def test_nothing_outside_the_journal_sets_its_attributes():
    """The engine tells the journal what it needs through methods (note_applied, mark_durable, verify_with, ...),
    so the journal's state has one owner."""
    writes = [w for name, path in modules().items() if name != JOURNAL for w in journal_writes(path)]
    assert not writes, f"attributes of the journal set from outside it: {writes}"


def test_the_journal_check_sees_an_attribute_set_from_outside(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("def f(self, journal):\n    journal.applied_index = 1\n    self.journal.corrupt[3] = 2\n"
                      "    setattr(self._journal, 'x', 1)\n    journal.mark_durable(4)\n")
    assert journal_writes(source) == ["x.py:2", "x.py:3", "x.py:4"]


def test_the_package_docstring_names_every_module():
    doc = ast.get_docstring(ast.parse((DLEDGER / "__init__.py").read_text())) or ""
    named = set(re.findall(r"\b_?[a-z][a-z_]*\b", doc))
    missing = sorted(path.stem for path in DLEDGER.glob("*.py") if path.stem != "__init__" and path.stem not in named)
    assert not missing, f"modules dledger/__init__.py does not name (one line each: its job): {missing}"
