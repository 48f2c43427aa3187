"""Errors that a message fully explains: a problem with the user's input (a config value, a file, the machine),
not a bug. The command line prints them in a line or two without a traceback (``--debug`` or ``TVR_DEBUG=1`` shows
it) and exits with code 2; every other exception is a bug and keeps its traceback."""

from __future__ import annotations


class UserError(Exception):
    """Base class of errors caused by the user's input; the message names the thing and what was expected."""


class RestartableStopError(Exception):
    """A job that stopped on purpose and continues when its command runs again (a training run preempted by its
    scheduler, after writing its checkpoint): the command line prints the message, no traceback, and exits with
    ``exit_code``, the code that tells a scheduler to restart it."""

    exit_code = 1


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a job that knows what it kept: the command line prints this message instead of the generic
    one, and exits with 130."""


def first_line(exc: BaseException) -> str:
    """An exception's message without what some libraries append (torch: a C++ backtrace, a source line), at most
    300 characters; its type's name when it has no message (a ``MemoryError``)."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def reason(exc: BaseException) -> str:
    """Why an operation failed, for a message that names the file itself: an OSError's text without its errno and
    file name (``No such file or directory``), a data file's ``problem`` without the file
    (:class:`tvr.utils.data_files.DataFileError`), any other exception's :func:`first_line`."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    problem = getattr(exc, "problem", None)
    if isinstance(exc, UserError) and isinstance(problem, str):
        return problem
    return first_line(exc)
