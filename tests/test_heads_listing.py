"""``tvr heads`` shows every option of every head with its default, allowed values and description, the ``#:``
comment above the field in the source (read by :func:`tvr.utils.fielddoc.field_comments`)."""

from __future__ import annotations

import dataclasses
import re

from typer.testing import CliRunner

from tvr.config import bounded, choice
from tvr.models.heads import registry
from tvr.utils.fielddoc import field_comments


@dataclasses.dataclass
class Documented:
    #: the first line
    #: and its continuation
    first: int = bounded(1, ge=0)
    #: shared by the next field (no blank line between them)
    low: float = 0.0
    high: float = 1.0

    undocumented: str = choice("a", "a", "b")
    #: a comment with [brackets] that are not markup
    bracketed: bool = False

    def validate(self) -> None:  # a method between fields is not a field
        pass


@dataclasses.dataclass
class Derived(Documented):
    #: declared in the subclass
    extra: int = 0


def test_field_comments_read_the_source() -> None:
    assert field_comments(Documented) == {
        "first": "the first line and its continuation",
        "low": "shared by the next field (no blank line between them)",
        "high": "shared by the next field (no blank line between them)",
        "bracketed": "a comment with [brackets] that are not markup",
    }
    assert field_comments(Derived)["extra"] == "declared in the subclass"
    assert field_comments(Derived)["first"] == "the first line and its continuation"
    # no source to read (a class made at run time): no descriptions, no error
    assert field_comments(dataclasses.make_dataclass("Dynamic", [("x", int, 0)])) == {}


def test_every_builtin_head_option_is_described() -> None:
    for name in registry.available_heads():
        options = registry.head_class(name).Options
        comments = field_comments(options)
        missing = [f.name for f in dataclasses.fields(options) if not comments.get(f.name)]
        assert not missing, f"{name}: options without a #: comment: {missing}"


def test_tvr_heads_prints_the_descriptions() -> None:
    from tvr.cli import app

    result = CliRunner().invoke(app, ["heads"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    sections = re.split(r"^head\.name: ", result.output, flags=re.M)[1:]
    by_head = {section.split(" ", 1)[0]: section for section in sections}
    assert sorted(by_head) == registry.available_heads()
    for name, section in by_head.items():
        assert section.startswith(f"{name} (indexable with its defaults: ")
        options = registry.head_class(name).Options
        comments = field_comments(options)
        for f in dataclasses.fields(options):
            row = next((line for line in section.splitlines() if re.match(rf"│ {f.name} +│", line)), None)
            assert row is not None, f"{name}.{f.name} is not listed"
            assert comments[f.name][:60] in row, (name, f.name, row)
    # brackets in a description are printed, not taken as console markup
    assert "[logvar_min, logvar_max]" in result.output
    assert ">= 0.0 and < 1.0" in result.output  # a bounded option's range
