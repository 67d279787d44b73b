"""The one validator of run ids and thread ids (boxwright.ids; issue 9, point 4; spec decision 7)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxwright.errors import InvalidRunIdError, InvalidThreadIdError
from boxwright.ids import (
    MAX_ID_CHARS,
    check_client_run_id,
    check_encodable_run_id,
    check_run_id,
    check_thread_id,
    id_problem,
)
from boxwright.journal import encode_run_id
from boxwright.runs import check_run_id as runs_check_run_id
from boxwright.runs import check_thread_id as runs_check_thread_id

# Each bad id, and the words its error must use: the value's problem, named.
BAD: list[tuple[object, str]] = [
    ("", "non-empty"),
    (".", "path component"),
    ("..", "path component"),
    ("/", "'/' at index 0"),
    ("a/b", "'/' at index 1"),
    ("../etc/passwd", "'/' at index 2"),
    ("\\", "'\\' at index 0"),
    ("a\\b", "'\\' at index 1"),
    ("\x00", "a NUL at index 0"),
    ("run\x00", "a NUL at index 3"),
    ("a\nb", "U+000A at index 1"),
    ("a\rb", "U+000D"),
    ("\t", "U+0009"),
    ("a\x1bb", "U+001B"),
    ("del\x7f", "U+007F"),
    ("c1\x85", "U+0085"),
    ("\ud800", "lone surrogate at index 0"),
    ("ok\udfff", "lone surrogate at index 2"),
    ("x" * (MAX_ID_CHARS + 1), f"{MAX_ID_CHARS + 1} characters long; at most {MAX_ID_CHARS}"),
    (None, "must be a string, not NoneType"),
    (7, "must be a string, not int"),
]
GOOD = [
    "run-1",
    "r",
    "...",
    ".hidden",
    "a..b",
    "x" * MAX_ID_CHARS,
    "a b 'quoted' \"too\"",
    "$(touch x);`id`",
    "🙂 é e\u0301",
    "_40",
    "@:%?#&=",
    "\u2028",  # a line separator, but not a control character (category Zl)
]


@pytest.mark.parametrize(("bad", "words"), BAD, ids=lambda v: repr(v)[:30])
def test_every_bad_id_is_refused_naming_its_problem(bad: object, words: str) -> None:
    problem = id_problem(bad)
    assert problem is not None and words in problem
    with pytest.raises(InvalidRunIdError) as run_error:
        check_run_id(bad)
    assert run_error.value.run_id == bad and run_error.value.reason == problem
    assert str(run_error.value).startswith("run id ") and words in str(run_error.value)
    assert run_error.value.code == "invalid_run_id"
    with pytest.raises(InvalidThreadIdError) as thread_error:
        check_thread_id(bad)
    assert thread_error.value.thread_id == bad and str(thread_error.value).startswith("thread id ")
    assert thread_error.value.code == "invalid_thread_id"


@pytest.mark.parametrize("good", GOOD, ids=lambda v: repr(v)[:30])
def test_anything_else_is_an_id(good: str) -> None:
    assert id_problem(good) is None
    assert check_run_id(good) is good
    assert check_thread_id(good) is good


def test_a_long_value_is_shown_cut_in_the_message() -> None:
    with pytest.raises(InvalidRunIdError) as caught:
        check_run_id("y" * 5000)
    assert len(str(caught.value)) < 200 and "5000 characters long" in str(caught.value)


def test_the_stores_and_the_journal_use_this_one_validator() -> None:
    # One home: runs.check_run_id is this function, not a copy of its rules.
    assert runs_check_run_id is check_run_id and runs_check_thread_id is check_thread_id


def test_a_client_chosen_run_id_also_keeps_to_r37s_characters() -> None:
    assert check_client_run_id("run:1.a-b_C") == "run:1.a-b_C"
    assert check_client_run_id("x" * 128) == "x" * 128
    for bad, words in [
        ("..", "path component"),
        ("a/b", "'/'"),
        ("a b", "[A-Za-z0-9._:-]"),
        ("x" * 129, "1-128 characters"),
        ("é", "[A-Za-z0-9._:-]"),
    ]:
        with pytest.raises(InvalidRunIdError, match="run id") as caught:
            check_client_run_id(bad)
        assert words in str(caught.value), (bad, str(caught.value))


def test_the_journal_name_encoder_alone_keeps_the_looser_rule() -> None:
    # A journal an older version wrote for "a/b" must still be named (a prune keeps it, never crashes).
    assert check_encodable_run_id("a/b") == "a/b"
    assert encode_run_id("..") == ".." and encode_run_id("a/b") == "a_2fb"
    for bad, words in [("", "non-empty"), ("\ud800", "lone surrogate"), (None, "non-empty")]:
        with pytest.raises(InvalidRunIdError, match=words):
            check_encodable_run_id(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=MAX_ID_CHARS + 20))
def test_the_rule_is_exactly_the_documented_one(value: str) -> None:
    expected_bad = (
        value in ("", ".", "..")
        or len(value) > MAX_ID_CHARS
        or any(ch in "/\\" or ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F or 0xD800 <= ord(ch) <= 0xDFFF for ch in value)
    )
    assert (id_problem(value) is not None) == expected_bad, repr(value)
