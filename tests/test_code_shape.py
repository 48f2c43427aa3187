"""benchmarks/code_shape.py counts what issue 37 sets goals for: a function of 81 lines is long and one of 80 is not,
arrows and floors come from the imports between parts, and the real package has no upward arrow and no cycle. The
package's shape holds: no more long functions and no more ``duplicates`` pairs than at the end of issue 50's work."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "code_shape.py"
PACKAGE = SCRIPT.parents[1] / "tvr"
#: the most each may be from now on: measured with benchmarks/code_shape.py, 11 and 41 on main at c016849 before
#: issue 50, 9 and 39 after it (a ratchet: lower them when a change lowers the count)
LONG_FUNCTIONS_BEFORE = 9
DUPLICATE_PAIRS_BEFORE = 39


def _script():
    spec = importlib.util.spec_from_file_location("code_shape", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _function(name: str, lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{k} = {k}\n" for k in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return 0\n"


def test_a_function_over_the_limit_is_long_from_its_def_line_to_its_last(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    method = "class A:\n    @staticmethod\n" + _function("method", 81, "    ")
    (package / "a.py").write_text(_function("short", 80) + "\n\n" + _function("long", 81) + "\n\n" + method)
    found = _script().long_functions(package, 80)
    assert [(f["function"], f["lines"]) for f in found] == [("long", 81), ("method", 81)]
    assert found[0]["where"] == "pkg/a.py:83"  # after 80 lines and two blank ones


def test_arrows_floors_upward_arrows_and_cycles_of_a_part_graph() -> None:
    # a imports b and c, b imports c: three arrows, three floors; c importing a would be a cycle and upward
    imports = {"tvr.a.x": {"tvr.b.y", "tvr.c.z"}, "tvr.b.y": {"tvr.c.z"}, "tvr.c.z": set()}
    script = _script()
    rules = SimpleNamespace(
        import_cycles=script._layering_rules().import_cycles,
        MODULES={name: name for name in imports},  # a module's "path" is its name here
        tvr_imports=lambda name: imports[name],
        part_of=lambda name: name.split(".")[1],
        ALLOWED={"a": {"b", "c"}, "b": {"c"}, "c": set()},
    )
    shape = script.layering(rules)
    assert (shape["rooms"], shape["floors"], shape["arrows"]) == (3, 3, 3)
    assert shape["upward_arrows"] == [] and shape["module_cycles"] == [] and shape["part_cycles"] == []
    imports["tvr.c.z"] = {"tvr.a.x"}
    shape = script.layering(rules)
    assert shape["upward_arrows"] == ["c -> a"] and shape["floors"] is None
    assert shape["module_cycles"] == ["tvr.a.x -> tvr.b.y -> tvr.c.z -> tvr.a.x"]


def test_the_package_has_no_upward_arrow_and_no_cycle(tmp_path: Path) -> None:
    out = tmp_path / "shape.json"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True, capture_output=True)
    shape = json.loads(out.read_text())
    assert shape["rooms"] >= 10 and shape["arrows"] > shape["rooms"]
    assert shape["upward_arrows"] == [] and shape["module_cycles"] == [] and shape["part_cycles"] == []
    assert shape["long_functions"] == len(shape["long_function_list"])
    assert shape["folder_back_arrows"] == 0, shape["folder_back_arrow_list"]


def test_arrows_back_up_inside_a_folder_are_those_on_a_cycle_of_its_entries() -> None:
    # inside tvr.m: the folder b and the module a import each other (both arrows on the cycle), c is only imported
    imports = {
        "tvr.m.a": {"tvr.m.b.x", "tvr.m.c"},
        "tvr.m.b.x": {"tvr.m.b.y"},
        "tvr.m.b.y": {"tvr.m.a"},
        "tvr.m.c": set(),
    }
    rules = SimpleNamespace(MODULES={name: name for name in imports}, tvr_imports=lambda name: imports[name])
    assert _script().folder_back_arrows(rules) == ["tvr.m: a -> b", "tvr.m: b -> a"]
    imports["tvr.m.b.y"] = {"tvr.m.c"}
    assert _script().folder_back_arrows(rules) == []


def test_no_more_functions_over_80_lines_than_before() -> None:
    found = _script().long_functions(PACKAGE, 80)
    listed = ", ".join(f"{f['function']} ({f['where']}, {f['lines']})" for f in found)
    assert len(found) <= LONG_FUNCTIONS_BEFORE, f"{len(found)} functions over 80 lines: {listed}"


@pytest.mark.skipif(shutil.which("duplicates") is None, reason="the duplicates tool is not installed")
def test_no_more_repeated_code_pairs_than_before() -> None:
    pairs = _script().duplicate_pairs(PACKAGE)
    assert pairs is not None and pairs <= DUPLICATE_PAIRS_BEFORE, (
        f"`duplicates --repo tvr` finds {pairs} pairs, more than {DUPLICATE_PAIRS_BEFORE}: run it and share the code"
    )
