"""The package's import graph: layers point one way and no tvr module imports itself back (static, from the AST).

Layers, top to bottom: ``tvr.cli``/``tvr.__main__`` → ``tvr.pipeline``/``tvr.demo`` → ``tvr.train``, ``tvr.eval``,
``tvr.search``, ``tvr.analysis`` → ``tvr.models`` → ``tvr.data`` → ``tvr.losses``, ``tvr.config``, ``tvr.types``,
``tvr.utils``. A module may import only from its own layer group's allowed targets; every import counts, including
the ones inside functions (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tvr"

#: what each top-level part may import from tvr (besides itself)
ALLOWED: dict[str, set[str]] = {
    "utils": set(),
    "types": set(),
    "config": {"utils"},
    "losses": set(),
    "data": {"config", "types", "utils"},
    "models": {"data", "losses", "config", "types", "utils"},
    "train": {"models", "data", "losses", "config", "types", "utils"},
    "eval": {"models", "data", "losses", "config", "types", "utils"},
    "search": {"eval", "models", "data", "losses", "config", "types", "utils"},
    "analysis": {"eval", "models", "data", "losses", "config", "types", "utils"},
    "pipeline": {"train", "eval", "search", "analysis", "models", "data", "losses", "config", "types", "utils"},
    "demo": {"pipeline", "train", "eval", "models", "data", "losses", "config", "types", "utils"},
    "cli": {"pipeline", "demo", "train", "eval", "search", "analysis", "models", "data", "losses", "config", "types",
            "utils"},
    "__main__": {"cli"},
    "__init__": set(),
}


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


def part_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_the_layers(module: str) -> None:
    part = part_of(module)
    assert part in ALLOWED, f"{module}: new top-level part {part!r}; add it to ALLOWED with its place in the layers"
    bad = sorted(
        target for target in tvr_imports(MODULES[module])
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
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
