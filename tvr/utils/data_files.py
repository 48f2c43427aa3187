"""Reading JSON and YAML as data: the one reader every JSON / YAML file tvr reads goes through.

Python's ``json`` and PyYAML parse nested values recursively, so a few hundred kilobytes of ``[[[[…`` stopped every
command that read such a file with a ``RecursionError`` traceback (or made the code that walks the value hit one
later), and a YAML file of a few aliases to aliases (a "billion laughs") expands to more nodes than memory holds.
Here a file is read only when it is a regular file of at most ``max_bytes``; JSON is parsed, then refused when
nested more than :data:`MAX_DEPTH` levels deep (tvr's own files nest about ten); YAML's event stream is walked
first (PyYAML's parser is not recursive, its composer is) and refused when it nests more than :data:`MAX_DEPTH`
levels or expands, aliases included, to more than :data:`MAX_YAML_NODES` nodes; only then is it loaded, with
``yaml.safe_load`` (data types only). Every refusal is a :class:`DataFileError`: one line naming the file (and the
line, where there is one) and what was wrong.
"""

from __future__ import annotations

import os
from itertools import chain
from pathlib import Path
from typing import Any

from tvr.utils.errors import UserError
from tvr.utils.io import NotRegularFileError, open_regular

#: how deep a JSON / YAML value may nest (objects and lists); tvr's own files nest about 10 levels
MAX_DEPTH = 100
#: the largest JSON file read (annotation sets and search-index manifests are the large ones)
MAX_JSON_BYTES = 1 << 30
#: the largest YAML file read: configs, presets and bench configs are a few kilobytes (PyYAML is pure Python)
MAX_YAML_BYTES = 16 << 20
#: the most nodes a YAML document may expand to, every alias counted as the node it repeats
MAX_YAML_NODES = 1_000_000


class DataFileError(UserError, ValueError):
    """A JSON / YAML file (or text) that cannot be read as data: not valid, too large, nested too deep.
    ``where`` names the file, ``line`` the line when known, ``problem`` says what was wrong (without the file)."""

    def __init__(self, where: str | os.PathLike, problem: str, line: int | None = None) -> None:
        self.where, self.problem, self.line = str(where), problem, line
        super().__init__(f"{where}{f':{line}' if line else ''}: {problem}")


def read_data_bytes(path: str | os.PathLike, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path`` (a FIFO or a device is refused, never waited on), refused when longer
    than ``max_bytes``. A missing file raises ``FileNotFoundError``."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            data = handle.read(max_bytes + 1) if size <= max_bytes else b""
    except NotRegularFileError as exc:
        raise DataFileError(path, exc.strerror) from None
    if size > max_bytes or len(data) > max_bytes:
        raise DataFileError(
            path, f"{max(size, len(data)):,} bytes, more than the {max_bytes:,} a file of this kind may hold"
        )
    return data


def _text(data: str | bytes, where: str | os.PathLike) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DataFileError(where, f"not UTF-8 text ({exc.reason} at byte {exc.start})", line) from None


def _too_deep(max_depth: int) -> str:
    return f"nested more than {max_depth} levels deep, where tvr's files nest about 10"


def json_depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether a parsed JSON value nests objects / lists more than ``max_depth`` levels deep (a level at a time,
    without recursion)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        dicts = (v for v in level if isinstance(v, dict))
        lists = (v for v in level if isinstance(v, list))
        children = chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists))
        level = [v for v in children if isinstance(v, (dict, list))]
    return False


def parse_json(
    data: str | bytes, where: str | os.PathLike, *, max_depth: int = MAX_DEPTH, line: int | None = None
) -> Any:
    """``data`` (text, or UTF-8 bytes) parsed as JSON, or :class:`DataFileError` naming ``where`` (and ``line``, the
    line ``data`` starts on in its file, for one record of a JSONL file)."""
    import json

    text = _text(data, where)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        at = exc.lineno + (line - 1 if line else 0)
        raise DataFileError(where, f"not valid JSON ({exc.msg}, column {exc.colno})", at) from None
    except RecursionError:
        raise DataFileError(where, _too_deep(max_depth), line) from None
    except ValueError as exc:  # a number of more digits than Python converts
        raise DataFileError(where, f"not valid JSON ({exc})", line) from None
    if json_depth_exceeds(value, max_depth):
        raise DataFileError(where, _too_deep(max_depth), line)
    return value


def read_json(path: str | os.PathLike, *, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The JSON value of the regular file ``path`` (see :func:`read_data_bytes` and :func:`parse_json`)."""
    return parse_json(read_data_bytes(path, max_bytes), path, max_depth=max_depth)


def read_jsonl(path: str | os.PathLike, *, max_bytes: int = MAX_JSON_BYTES) -> list[Any]:
    """All records of a JSONL log (an append-only run log; [] when there is none); a torn last line (a crash while
    appending) is ignored, a bad line elsewhere is a :class:`DataFileError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        return []
    lines = _text(read_data_bytes(path, max_bytes), path).splitlines()
    records = []
    for k, text in enumerate(lines):
        if not text.strip():
            continue
        try:
            records.append(parse_json(text, path, line=k + 1))
        except DataFileError as exc:
            if k == len(lines) - 1 and exc.problem.startswith("not valid JSON"):
                break
            raise
    return records


def _check_yaml_events(text: str, where: str | os.PathLike, max_depth: int, max_nodes: int) -> None:
    """Walk PyYAML's event stream (its parser keeps an explicit stack: no recursion) and refuse a document nesting
    more than ``max_depth`` levels or expanding to more than ``max_nodes`` nodes, each alias counted as the whole
    node it repeats (its anchor's size and height are known once that node has ended)."""
    import yaml

    anchors: dict[str, tuple[int, int]] = {}  # anchor → (nodes, levels) of the node it names
    open_nodes: list[list[Any]] = []  # per open collection: [anchor, nodes so far, levels below it]
    expanded = 0

    def ended(anchor: str | None, nodes: int, levels: int, mark: Any) -> None:
        nonlocal expanded
        if anchor is not None:
            anchors[anchor] = (nodes, levels)
        if len(open_nodes) + levels > max_depth:
            raise DataFileError(where, _too_deep(max_depth), mark.line + 1)
        if open_nodes:
            open_nodes[-1][1] += nodes
            open_nodes[-1][2] = max(open_nodes[-1][2], levels)

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        mark = event.start_mark
        if isinstance(event, yaml.CollectionStartEvent):
            expanded += 1
            open_nodes.append([event.anchor, 1, 0])
            if len(open_nodes) > max_depth:
                raise DataFileError(where, _too_deep(max_depth), mark.line + 1)
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, nodes, levels = open_nodes.pop()
            ended(anchor, nodes, levels + 1, mark)
        elif isinstance(event, yaml.ScalarEvent):
            expanded += 1
            ended(event.anchor, 1, 0, mark)
        elif isinstance(event, yaml.AliasEvent):
            nodes, levels = anchors.get(event.anchor, (1, 0))  # an unknown anchor: the loader says so
            expanded += nodes
            ended(None, nodes, levels, mark)
        if expanded > max_nodes:
            raise DataFileError(
                where, f"made of aliases that expand to more than {max_nodes:,} values; refused",
                mark.line + 1,
            )  # fmt: skip


def _mark_line(mark: Any) -> int | None:
    return mark.line + 1 if mark is not None else None


def _yaml_problem(exc: Any, text: str) -> str:
    """PyYAML's error in one line: the problem, then the context (where the unfinished node started) and that
    line's text, shortened."""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    context, mark = (
        getattr(exc, "context", None),
        getattr(exc, "context_mark", None) or getattr(exc, "problem_mark", None),
    )
    if mark is None:
        return f"not valid YAML: {problem}"
    lines = text.splitlines()
    shown = lines[mark.line].strip() if mark.line < len(lines) else ""
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    where = f"{context} on line {mark.line + 1}" if context else f"line {mark.line + 1}"
    return f"not valid YAML: {problem} ({where}: {shown})" if shown else f"not valid YAML: {problem} ({where})"


def parse_yaml(
    data: str | bytes, where: str | os.PathLike, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_YAML_NODES
) -> Any:
    """``data`` parsed as YAML with ``yaml.safe_load`` after the bounds of :func:`_check_yaml_events`, or
    :class:`DataFileError` naming ``where`` (and the line)."""
    import yaml

    text = _text(data, where)
    try:
        _check_yaml_events(text, where, max_depth, max_nodes)
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DataFileError(where, _yaml_problem(exc, text), _mark_line(getattr(exc, "problem_mark", None))) from None
    except RecursionError:  # not reached within the bounds above; kept so no input can end in a traceback
        raise DataFileError(where, _too_deep(max_depth)) from None


def read_yaml(path: str | os.PathLike, *, max_bytes: int = MAX_YAML_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """The YAML value of the regular file ``path`` (see :func:`read_data_bytes` and :func:`parse_yaml`)."""
    return parse_yaml(read_data_bytes(path, max_bytes), path, max_depth=max_depth)


__all__ = [
    "MAX_DEPTH",
    "MAX_JSON_BYTES",
    "MAX_YAML_BYTES",
    "MAX_YAML_NODES",
    "DataFileError",
    "json_depth_exceeds",
    "parse_json",
    "parse_yaml",
    "read_data_bytes",
    "read_json",
    "read_jsonl",
    "read_yaml",
]
