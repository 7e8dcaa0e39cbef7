"""dledger's modules as a reader meets them: pysyncobj's private names spelled only in the seam, the journal changed
only through its own methods, and every module named in the package's docstring. (No import cycle and no module
over 700 lines: tests/test_layers.py checks those over every library module.)

Everything here reads the source with `ast` (or a regular expression); nothing of dledger is imported.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

DLEDGER = Path(__file__).resolve().parents[2] / "dledger"
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
