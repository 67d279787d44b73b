"""The one validator of run ids and thread ids, used by every entry point that takes one.

A run id names a journal file, a bridge URL segment (``/runs/<id>/mcp``), a tool-exec path, a
tail route and a store key; a thread id names a run's thread in stores and events. An id that
is a path component of its own (``.``, ``..``), holds a separator (``/``, ``\\``), a NUL or
another control character (a log line or header it lands in is forged), a lone surrogate (not
UTF-8: JS would turn it into U+FFFD and give two ids one run, spec decision 7), or is longer
than ``MAX_ID_CHARS`` is refused here, with the value's problem named, before it reaches any of
those places. HTTP faces answer 400 with the code ``invalid_run_id`` / ``invalid_thread_id``.

``check_encodable_run_id`` is the looser rule of the journal's file-name encoder alone: a name
written by an older version (whose run id this validator now refuses) must still decode, so a
prune can keep it, and never crash on it.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Final

from .errors import InvalidRunIdError, InvalidThreadIdError

__all__ = [
    "MAX_CLIENT_RUN_ID_CHARS",
    "MAX_ID_CHARS",
    "check_client_run_id",
    "check_encodable_run_id",
    "check_run_id",
    "check_thread_id",
    "id_problem",
]

MAX_ID_CHARS: Final = 200
# What a client may choose as a run id on POST /runs (coordinator R37): it also lands in headers.
MAX_CLIENT_RUN_ID_CHARS: Final = 128
_CLIENT_RUN_ID = re.compile(rf"[A-Za-z0-9._:-]{{1,{MAX_CLIENT_RUN_ID_CHARS}}}")
_SEPARATORS: Final = {"/": "a '/'", "\\": "a '\\'"}
# One search per id (every store call checks one): the separators, Unicode category Cc (exactly
# U+0000-U+001F and U+007F-U+009F) and Cs (lone surrogates).
_REFUSED_CHAR = re.compile(r"[/\\\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def _utf8_problem(value: str) -> str | None:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid UTF-8 text: a lone surrogate at index {exc.start}"
    return None


def id_problem(value: object) -> str | None:
    """Why ``value`` cannot be a run or thread id (a phrase to follow the id), or ``None`` if it can."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value:
        return "must be a non-empty string"
    if value in (".", ".."):
        return f"is {value!r}, a path component of its own (it would name a directory, not a run)"
    if len(value) > MAX_ID_CHARS:
        return f"is {len(value)} characters long; at most {MAX_ID_CHARS} are allowed"
    found = _REFUSED_CHAR.search(value)
    if found is None:
        return None
    index, char = found.start(), found.group()
    if char in _SEPARATORS:
        return f"holds {_SEPARATORS[char]} at index {index}: a path separator cannot be part of an id"
    if unicodedata.category(char) == "Cs":
        return f"is not valid UTF-8 text: a lone surrogate at index {index}"
    name = "a NUL" if char == "\x00" else f"the control character U+{ord(char):04X}"
    return f"holds {name} at index {index}: control characters are not allowed"


def check_run_id(run_id: object) -> str:
    """``run_id`` if it can name a run, else ``InvalidRunIdError`` naming what is wrong with it."""
    problem = id_problem(run_id)
    if problem is not None:
        raise InvalidRunIdError(run_id, problem)
    assert isinstance(run_id, str)
    return run_id


def check_thread_id(thread_id: object) -> str:
    """``thread_id`` if it can name a thread, else ``InvalidThreadIdError`` naming what is wrong with it."""
    problem = id_problem(thread_id)
    if problem is not None:
        raise InvalidThreadIdError(thread_id, problem)
    assert isinstance(thread_id, str)
    return thread_id


def check_client_run_id(run_id: object) -> str:
    """A run id a client chose (``X-Run-Id`` / ``runId`` of POST /runs): ``check_run_id``, then R37's
    narrower set, since the id is echoed in headers and URLs the client builds itself."""
    check_run_id(run_id)
    assert isinstance(run_id, str)
    if not _CLIENT_RUN_ID.fullmatch(run_id):
        raise InvalidRunIdError(
            run_id, f"is not 1-{MAX_CLIENT_RUN_ID_CHARS} characters of [A-Za-z0-9._:-] (what a client may choose)"
        )
    return run_id


def check_encodable_run_id(run_id: object) -> str:
    """The journal name encoder's rule: non-empty UTF-8 text. Looser than ``check_run_id`` on purpose."""
    if not isinstance(run_id, str) or not run_id:
        raise InvalidRunIdError(run_id, "must be a non-empty string")
    problem = _utf8_problem(run_id)
    if problem is not None:
        raise InvalidRunIdError(run_id, problem + " and cannot name a journal")
    return run_id
