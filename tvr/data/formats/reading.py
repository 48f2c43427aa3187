"""What every dataset format's reader shares: the error it raises, the file readers (text, JSON, JSON lines, CSV, id
lists) that name the file, line and field of a problem, field checks, and a parse cache keyed on the files' identity.

Malformed files raise :class:`AnnotationError` naming the file, the line or JSON path, and the expected format.
"""

from __future__ import annotations

import csv
import io
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tvr.utils.data_files import DataFileError, parse_json
from tvr.utils.errors import UserError


class AnnotationError(UserError, ValueError):
    """An annotation file is missing or malformed; the message names the file, the place and what was expected."""


def _where(path: Path | str, line: int | None = None, field_path: str | None = None) -> str:
    out = str(path)
    if line is not None:
        out += f" line {line}"
    if field_path:
        out += f" field {field_path!r}"
    return out


def annotation_error(
    path: Path | str, message: str, line: int | None = None, field_path: str | None = None
) -> AnnotationError:
    return AnnotationError(f"{_where(path, line, field_path)}: {message}")


def not_a_file(path: Path) -> str:
    """What stands at ``path`` instead of the file an annotation reader wanted."""
    return "is a folder" if path.is_dir() else "is not a regular file" if path.exists() else "file not found"


def read_text(path: Path, expected: str) -> str:
    if not path.is_file():
        raise annotation_error(path, f"{not_a_file(path)}; expected {expected}")
    data = path.read_bytes()
    return decode_text(data, path, expected)


def decode_text(data: bytes, where: Path | str, expected: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise annotation_error(where, f"not UTF-8 text ({exc.reason}); expected {expected}", line) from exc
    if not text.strip():
        raise annotation_error(where, f"file is empty; expected {expected}")
    return text


def parse_json_text(text: str, where: Path | str, expected: str, line: int | None = None) -> Any:
    try:
        return parse_json(text, where, line=line)
    except DataFileError as exc:
        raise annotation_error(where, f"{exc.problem}; expected {expected}", exc.line) from None


def read_json(path: Path, expected: str) -> Any:
    return parse_json_text(read_text(path, expected), path, expected)


def read_jsonl(path: Path, expected: str) -> list[tuple[int, dict]]:
    """(line number, object) for every non-blank line; CRLF and a missing final newline are fine."""
    rows = []
    for number, line in enumerate(read_text(path, expected).split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        obj = parse_json_text(line, path, expected, number)
        if not isinstance(obj, dict):
            raise annotation_error(
                path, f"expected a JSON object per line ({expected}), got {type(obj).__name__}", number
            )
        rows.append((number, obj))
    return rows


def _csv_problem(exc: csv.Error, start: int, expected: str) -> tuple[str, int]:
    """(message, line) for a row the CSV reader refused; a field over the reader's size limit names itself (it is
    valid CSV: a caption that long, or an unclosed quote that made the rest of the file one field)."""
    if "field larger than field limit" in str(exc):
        limit = csv.field_size_limit()
        return (
            f"a field longer than {limit:,} characters, the most a CSV field may hold here: a caption that long is "
            'not read, and an unclosed quote (") makes everything after it one field; expected ' + expected,
            start,
        )
    return f"not valid CSV ({exc}); expected {expected}", start


def read_csv(path: Path, required: Sequence[str], expected: str) -> list[tuple[int, dict[str, str]]]:
    """(line number, row) for every data row; the header must contain ``required``."""
    text = read_text(path, expected)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [h.strip() for h in next(reader)]
    except csv.Error as exc:
        raise annotation_error(path, *_csv_problem(exc, 1, expected)) from exc
    for column in required:
        if column not in header:
            raise annotation_error(path, f"expected a {column!r} column in the header ({expected}); found {header}", 1)
    rows = []
    while True:
        start = reader.line_num + 1  # where the next row starts (a quoted field may span lines)
        try:
            values = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise annotation_error(path, *_csv_problem(exc, start, expected)) from exc
        if not values or all(not v.strip() for v in values):
            continue
        if len(values) != len(header):
            raise annotation_error(
                path, f"expected {len(header)} fields {header}, found {len(values)}: {values}", reader.line_num
            )
        rows.append((reader.line_num, dict(zip(header, values, strict=True))))
    return rows


def read_id_list(path: Path, expected: str) -> list[tuple[int, str]]:
    """(line number, id) for a one-id-per-line text file; duplicates are an error."""
    seen: dict[str, int] = {}
    out = []
    for number, line in enumerate(read_text(path, expected).split("\n"), start=1):
        vid = line.strip()
        if not vid:
            continue
        if vid in seen:
            raise annotation_error(path, f"video id {vid!r} listed twice (first on line {seen[vid]})", number)
        seen[vid] = number
        out.append((number, vid))
    return out


def need_str(value: Any, where: Path | str, line: int | None, field_path: str, expected: str) -> str:
    """A non-empty string field, or an error naming where it is and what was expected."""
    if not isinstance(value, str):
        got = "missing" if value is None else f"a {type(value).__name__}"
        raise annotation_error(where, f"expected a non-empty string ({expected}), got {got}", line, field_path)
    if not value.strip():
        raise annotation_error(where, f"empty string; expected {expected}", line, field_path)
    return value


def need_str_list(value: Any, where: Path | str, line: int | None, field_path: str, expected: str) -> list[str]:
    if not isinstance(value, list) or not value:
        got = "missing" if value is None else repr(value)[:60]
        raise annotation_error(where, f"expected a non-empty list of strings ({expected}), got {got}", line, field_path)
    return [need_str(v, where, line, f"{field_path}[{k}]", expected) for k, v in enumerate(value)]


# ------------------------------------------------------------------------------------------ parse cache

_CACHE: OrderedDict[tuple, Any] = OrderedDict()
_CACHE_SIZE = 16


def cached_parse(tag: str, paths: Sequence[Path], parse: Callable[[], Any]) -> Any:
    """Memoise ``parse()`` on the identity (path, size, mtime) of the files it reads.

    load_split is called for train, val and describe_split_source in one run; the MSR-VTT release JSON is 23 MB, so
    parse it once. Cached values are never mutated by callers.
    """
    key: tuple = (tag,)
    for p in paths:
        if not p.is_file():
            raise annotation_error(p, "file not found")
        st = p.stat()
        key += (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    value = parse()
    _CACHE[key] = value
    while len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return value


def clear_cache() -> None:
    """Forget parsed annotation files (they are re-read when their size or mtime changes anyway)."""
    _CACHE.clear()
