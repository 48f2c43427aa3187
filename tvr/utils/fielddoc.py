"""The documentation of a dataclass's fields: the ``#:`` comment lines right above each field in the class body
(the convention Sphinx autodoc reads), taken from the source with :mod:`ast` so ``tvr heads`` shows what a
preset's author reads in the code."""

from __future__ import annotations

import ast
import inspect
import textwrap


def field_comments(cls: type) -> dict[str, str]:
    """``{field name: its #: comment}`` for every annotated field of ``cls`` that has one (lines joined with a
    space). A field with no comment of its own placed right under a commented field (no blank line between) shares
    that comment, as in ``#: director d = δ·t − η·l`` above ``delta`` and ``eta``. Fields inherited from a base
    class are looked up in that class; a class whose source is unavailable (built in an interpreter session, a
    frozen application) gives ``{}``."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is object:
            continue
        out.update(_own_comments(klass))
    return out


def _own_comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    lines = source.splitlines()
    classdef = next((n for n in tree.body if isinstance(n, ast.ClassDef)), None)
    if classdef is None:
        return {}
    out = {}
    previous: ast.AnnAssign | None = None
    for node in classdef.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            previous = None
            continue
        row = node.lineno - 2  # the line above the field (0-based)
        comment: list[str] = []
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if comment:
            out[node.target.id] = " ".join(part for part in comment if part)
        elif previous is not None and previous.target.id in out and previous.end_lineno == node.lineno - 1:
            out[node.target.id] = out[previous.target.id]
        previous = node
    return out
