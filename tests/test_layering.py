"""The package's import graph: layers point one way and no tvr module imports itself back (static, from the AST).

Layers, top to bottom (docs/architecture.md): ``tvr.cli``/``tvr.__main__`` → ``tvr.bench`` (synthetic data with
dials, the demo, runs, statistics, reports, sweeps: imported by the CLI alone) → ``tvr.pipeline`` → ``tvr.methods`` →
``tvr.train``, ``tvr.eval``, ``tvr.search``, ``tvr.analysis`` → ``tvr.models`` → ``tvr.data`` → ``tvr.losses``,
``tvr.config``, ``tvr.types``, ``tvr.utils``. A module may import from any layer below its own, with two limits:
in the train/eval/search/analysis layer train and eval never import each other (search and analysis may use eval),
and the CLI never imports ``tvr.train``: a job that trains, or writes a training checkpoint, is a pipeline job, so
the CLI and Python callers run the same code.
Every import counts, including the ones inside functions (a lazy import is still a dependency).

A method's folder ``tvr/methods/<method>/`` sits above analysis and evaluation, so its ``figures`` module (or
package) may use ``tvr.analysis`` and ``tvr.eval`` like any module of its layer; nothing below imports a method
(the head registry finds the folders by name). Inside the folder two rules hold: only ``figures`` uses
``tvr.analysis`` (a head is built in every job and never loads plotting code), and its ``losses`` module is held to
the rule of ``tvr.losses``: pure tensor functions, importing nothing of tvr but ``tvr.losses``, ``tvr.types`` and
``tvr.utils``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tvr"

#: the layers, top to bottom; a part may import from every layer below its own
LAYERS: list[set[str]] = [
    {"cli", "__main__"},
    {"bench"},  # synthetic data, the demo, runs, statistics, report, sweeps: imported by the CLI alone
    {"pipeline"},
    {"methods"},
    {"train", "eval", "search", "analysis"},
    {"models"},
    {"data"},
    {"config", "losses", "types", "utils"},
]
#: imports inside a layer (train and eval are siblings that never import each other)
SAME_LAYER = {"search": {"eval"}, "analysis": {"eval"}, "config": {"utils"}, "__main__": {"cli"}}
#: imports from below that are still refused: the CLI reaches training through pipeline jobs only
FORBIDDEN = {"cli": {"train"}, "__main__": {"train"}}


def _allowed() -> dict[str, set[str]]:
    allowed = {"__init__": set()}
    for depth, layer in enumerate(LAYERS):
        below = set().union(*LAYERS[depth + 1 :])
        for part in layer:
            allowed[part] = (below | SAME_LAYER.get(part, set())) - FORBIDDEN.get(part, set())
    allowed["losses"] = set()  # pure tensor functions
    allowed["types"] = set()
    allowed["utils"] = set()
    return allowed


#: what each top-level part may import from tvr (besides itself)
ALLOWED: dict[str, set[str]] = _allowed()


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def tvr_imports(path: Path) -> set[str]:
    """Every ``tvr`` module named by an import statement anywhere in the file (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name == "tvr" or a.name.startswith("tvr."))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "tvr" or target.startswith("tvr."):
                found.add(target)
                # ``from tvr.x import y`` may name a submodule y
                for alias in node.names:
                    if (PACKAGE.parent / Path(*f"{target}.{alias.name}".split("."))).with_suffix(".py").is_file():
                        found.add(f"{target}.{alias.name}")
    return found


#: where the methods' folders are — ``tvr.methods.<method>.*``
METHODS = ("tvr", "methods")
#: what a method's losses module may import from tvr (besides its own module)
PURE_LOSS_IMPORTS = {"tvr.losses", "tvr.types", "tvr.utils"}


def method_module(module: str, name: str) -> bool:
    """True for ``tvr.methods.<method>.<name>`` and anything below it."""
    parts = module.split(".")
    return len(parts) >= 4 and tuple(parts[:2]) == METHODS and parts[3] == name


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    part = part_of(module)
    assert part in ALLOWED, f"{module}: new top-level part {part!r}; add it to ALLOWED with its place in the layers"
    bad = sorted(
        target
        for target in tvr_imports(MODULES[module])
        if part_of(target) != part and part_of(target) != "__init__" and part_of(target) not in ALLOWED[part]
    )
    assert not bad, f"{module} ({part}) imports {bad}; {part} may import only {sorted(ALLOWED[part])}"


def test_losses_are_pure() -> None:
    imports = tvr_imports(MODULES["tvr.losses"])
    assert not imports, f"tvr.losses must be pure tensor functions, imports {sorted(imports)}"


def test_no_import_cycles_among_tvr_modules() -> None:
    graph = {}
    for name, path in MODULES.items():
        graph[name] = {t for t in tvr_imports(path) if t in MODULES and t != name}
    # a package's __init__ is imported by its submodules implicitly; those edges are not cycles of our making
    cycles = import_cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles a depth-first walk of ``graph`` (node -> the nodes it imports) meets, each closing edge once
    (benchmarks/code_shape.py counts them with this too)."""
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return cycles


METHOD_LOSSES = sorted(m for m in MODULES if method_module(m, "losses"))


def test_every_method_keeps_its_losses_in_its_folder() -> None:
    assert {m.split(".")[2] for m in METHOD_LOSSES} >= {"gare", "gravialign", "proxy"}


@pytest.mark.parametrize("module", METHOD_LOSSES)
def test_method_losses_are_pure(module: str) -> None:
    bad = sorted(
        t
        for t in tvr_imports(MODULES[module])
        if not any(t == ok or t.startswith(f"{ok}.") for ok in PURE_LOSS_IMPORTS)
    )
    assert not bad, f"{module} must be pure tensor functions (torch, tvr.losses/types/utils only), imports {bad}"


#: every module of a method's folder but its figures
METHOD_MODULES = sorted(
    m for m in MODULES if m.startswith("tvr.methods.") and m.count(".") >= 2 and not method_module(m, "figures")
)


def test_method_modules_are_found() -> None:
    assert {m.split(".")[2] for m in METHOD_MODULES} >= {"clip4clip", "gare", "gravialign", "proxy"}


@pytest.mark.parametrize("module", METHOD_MODULES)
def test_only_a_methods_figures_use_analysis(module: str) -> None:
    bad = sorted(t for t in tvr_imports(MODULES[module]) if t == "tvr.analysis" or t.startswith("tvr.analysis."))
    assert not bad, f"{module} imports {bad}; only the method's figures may use tvr.analysis (a head loads no plots)"
