"""The shape of the ``tvr`` package, from its source alone: long functions and the import graph between its parts.

Issue 37 measures these before and after a restructuring, so they are counted by a script anyone can re-run rather
than by hand. Every figure comes from parsing the files (``ast``); no module of ``tvr`` is run.

* **Long functions**: every ``def`` (functions, methods, nested functions) whose body runs over ``--max-lines``
  lines (80), counted from the ``def`` line to its last line, decorators excluded.
* **Rooms and floors**: the package's top-level parts (``tvr.data``, ``tvr.losses``, ``tvr/__init__.py`` …) and the
  longest chain of parts importing each other (a part with no imports is floor 1).
* **Arrows**: distinct (part → other part) pairs where some module of the first imports a module of the second,
  lazy imports inside functions included; **upward** arrows are those the layering rules of
  ``tests/test_layering.py`` refuse (the rules are imported from there, so there is one copy of them).
* **Cycles**: import cycles among modules (as the layering test looks for them) and among parts.
* **Arrows back up inside folders**: in every folder of the package (``tvr``, ``tvr/models``,
  ``tvr/models/backbones`` …), the arrows between its entries (modules and sub-folders, a folder counting as all it
  holds) that lie on a cycle: a folder declares no order of its own, so an arrow on a cycle runs back up whatever
  order is drawn (issue 50: ``tvr/models/backbones/<name>/`` and the loose modules of ``tvr/models`` imported each
  other).
* **Duplicates**: when the ``duplicates`` tool is on ``PATH``, its count of repeated-code pairs inside ``tvr/``.

    .venv/bin/python benchmarks/code_shape.py   # writes benchmarks/results/code_shape.json
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tvr.utils.io import atomic_write_json

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "results" / "code_shape.json"


def _layering_rules():
    """tests/test_layering.py as a module: its module naming, import reading, allowed-imports table and cycle
    finder."""
    spec = importlib.util.spec_from_file_location("tvr_layering_rules", REPO / "tests" / "test_layering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def long_functions(package: Path, max_lines: int) -> list[dict]:
    """Every function of ``package`` longer than ``max_lines``, longest first."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > max_lines:
                    found.append((-lines, str(path.relative_to(package.parent)), node.lineno, node.name))
    return [{"function": name, "where": f"{file}:{line}", "lines": -minus} for minus, file, line, name in sorted(found)]


def _floors(parts: dict[str, set[str]]) -> int:
    """The longest chain of importing parts, counted in parts (needs an acyclic part graph)."""
    depth: dict[str, int] = {}

    def floor(part: str) -> int:
        if part not in depth:
            depth[part] = 0  # guards against a cycle; the figure is then only a lower bound
            depth[part] = 1 + max((floor(below) for below in parts[part]), default=0)
        return depth[part]

    return max(floor(part) for part in parts)


def layering(rules) -> dict:
    modules = rules.MODULES
    module_graph = {
        name: {t for t in rules.tvr_imports(path) if t in modules and t != name} for name, path in modules.items()
    }
    parts: dict[str, set[str]] = {rules.part_of(name): set() for name in modules}
    for name, targets in module_graph.items():
        source = rules.part_of(name)
        parts[source].update(rules.part_of(t) for t in targets if rules.part_of(t) != source)
    arrows = sorted((source, target) for source, targets in parts.items() for target in targets)
    upward = [
        f"{source} -> {target}"
        for source, target in arrows
        if target != "__init__" and target not in rules.ALLOWED.get(source, set())
    ]
    part_cycles = rules.import_cycles(parts)
    return {
        "modules": len(modules),
        "rooms": len(parts),
        "floors": _floors(parts) if not part_cycles else None,
        "arrows": len(arrows),
        "upward_arrows": upward,
        "module_cycles": [" -> ".join(c) for c in rules.import_cycles(module_graph)],
        "part_cycles": [" -> ".join(c) for c in part_cycles],
        "arrow_list": [f"{source} -> {target}" for source, target in arrows],
    }


def folder_back_arrows(rules) -> list[str]:
    """Every arrow between two entries of one folder that lies on a cycle among that folder's entries, as
    ``folder: a -> b`` (the module docstring)."""
    modules = rules.MODULES
    graph = {name: {t for t in rules.tvr_imports(path) if t in modules and t != name} for name, path in modules.items()}
    folders = sorted({".".join(name.split(".")[:depth]) for name in modules for depth in range(1, name.count(".") + 1)})
    found = []
    for folder in folders:
        depth = folder.count(".") + 1

        def entry(module: str, folder: str = folder, depth: int = depth) -> str | None:
            inside = module.startswith(f"{folder}.")
            return module.split(".")[depth] if inside else None

        arrows: dict[str, set[str]] = {}
        for source, targets in graph.items():
            here = entry(source)
            if here is not None:
                arrows.setdefault(here, set()).update(t for t in map(entry, targets) if t is not None and t != here)
        for source, targets in sorted(arrows.items()):
            found.extend(
                f"{folder}: {source} -> {target}" for target in sorted(targets) if _reaches(arrows, target, source)
            )
    return found


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen: set[str] = set()
    stack = [start]
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return False


def duplicate_pairs(package: Path) -> int | None:
    """The ``duplicates`` tool's pair count for ``package`` (None when the tool is not installed)."""
    tool = shutil.which("duplicates")
    if tool is None:
        return None
    result = subprocess.run(
        [tool, "--repo", str(package), "--most", "1", "--seconds", "120"],
        check=True,
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    first = result.stdout.splitlines()[0] if result.stdout else ""
    if first.startswith("no duplicates"):
        return 0
    match = re.match(r"(\d+) pairs? ", first)
    if match is None:
        raise RuntimeError(f"unexpected duplicates output: {first!r}")
    return int(match.group(1))


def source_label() -> str | None:
    """The commit measured (``+ changes`` when the working tree differs from it), or None outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], check=True, capture_output=True, text=True, cwd=REPO)
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "tvr"], check=True, capture_output=True, text=True, cwd=REPO
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head.stdout.strip() + (" + changes" if status.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-lines", type=int, default=80, help="a function longer than this counts as long")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--source", help="what is measured, for the record (default: the git commit of tvr/)")
    args = parser.parse_args()
    package = REPO / "tvr"
    rules = _layering_rules()
    functions = long_functions(package, args.max_lines)
    result = {
        "source": args.source or source_label(),
        "max_lines": args.max_lines,
        "long_functions": len(functions),
        "long_function_list": functions,
        **layering(rules),
        "folder_back_arrows": len(back := folder_back_arrows(rules)),
        "folder_back_arrow_list": back,
        "duplicate_pairs": duplicate_pairs(package),
        "command": "python benchmarks/code_shape.py"
        + ("" if args.max_lines == 80 else f" --max-lines {args.max_lines}"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, result)
    summary = {k: v for k, v in result.items() if not k.endswith("_list")}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    sys.exit(main())
