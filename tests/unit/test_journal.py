"""The journal's pure parts (spec/durable-runs.md R8-R17, R22): names, paths, commands, parsers, framing."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import subprocess
import tempfile

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from boxwright.errors import AgentProcessExitError, InvalidRunIdError, JournalAttachUnavailableError, JournalFrameError
from boxwright.ids import id_problem
from boxwright.journal import (
    DEFAULT_JOURNAL_DIR,
    NONCE_DOMAIN,
    Base64Frame,
    Decoded,
    JournalDirEntry,
    JournalLine,
    KeptJournal,
    Listed,
    Malformed,
    PruneJournalsResult,
    Truncated,
    Unavailable,
    _LineSplitter,
    decode_base64_frame,
    decode_journal_run_id,
    encode_run_id,
    exit_sentinel_line,
    journal_cleanup_command,
    journal_dir_of,
    journal_exists_command,
    journal_exit_probe_command,
    journal_follow_command,
    journal_list_command,
    journal_mtime_list_command,
    journal_paths,
    journal_read_command,
    journal_read_strategy,
    journal_stderr_read_command,
    journaled_command,
    parse_exit_sentinel,
    parse_journal_exit,
    parse_journal_mtime_listing,
)
from boxwright.sandbox import Capabilities

TOKEN = re.compile(r"[A-Za-z0-9._-]+")
ADVERSARIAL = [
    "a/b",
    "../etc/passwd",
    "..",
    ".",
    "a b",
    "it's",
    'say "hi"',
    "$(rm -rf /)",
    "`id`",
    "a;b",
    "x\ny",
    "\x00",
    "🙂",
    "é",
    "e\u0301",
    "_",
    "_40",
    "@",
    "a%2Fb",
    "CON",
    "con.txt",
    "-rf",
]


# -- R8, R11: paths and nonce -----------------------------------------------------------------------


def test_paths_are_pure_and_use_both_suffixes_under_the_default_dir() -> None:
    first = journal_paths("run-1")
    assert first == journal_paths("run-1")
    assert first.dir == DEFAULT_JOURNAL_DIR == "/tmp/boxwright-runs"
    assert first.journal == "/tmp/boxwright-runs/run-1.ndjson"
    assert first.stderr == "/tmp/boxwright-runs/run-1.err"
    expected_nonce = hashlib.sha256(f"{NONCE_DOMAIN}:run-1".encode()).hexdigest()[:32]
    assert NONCE_DOMAIN == "boxwright/journal-exit-sentinel/v1"
    assert first.nonce == expected_nonce
    assert journal_paths("run-2").nonce != first.nonce


def test_trailing_slashes_are_normalised_and_bad_dirs_refused() -> None:
    assert journal_paths("r", "/var/j/") == journal_paths("r", "/var/j")
    assert journal_paths("r", "/var/j//").journal == "/var/j/r.ndjson"
    assert journal_paths("r", "/").journal == "/r.ndjson"
    for bad in ("", "relative/dir", "./x"):
        with pytest.raises(ValueError, match="absolute"):
            journal_paths("r", bad)


def test_empty_run_id_is_refused() -> None:
    with pytest.raises(InvalidRunIdError, match="non-empty"):
        journal_paths("")
    with pytest.raises(InvalidRunIdError):
        encode_run_id("")


# -- R9: the encoder --------------------------------------------------------------------------------


def test_underscore_is_escaped_so_at_and_its_escape_differ() -> None:
    assert encode_run_id("@") == "_40"
    assert encode_run_id("_40") == "_5f40"
    assert encode_run_id("a_b") == "a_5fb"
    assert encode_run_id("A-z.9") == "A-z.9"


def test_adversarial_ids_give_distinct_filename_safe_tokens() -> None:
    tokens = [encode_run_id(run_id) for run_id in ADVERSARIAL]
    assert len(set(tokens)) == len(tokens)
    for run_id, token in zip(ADVERSARIAL, tokens, strict=True):
        assert TOKEN.fullmatch(token), (run_id, token)
        if id_problem(run_id) is not None:
            # The encoder still names it (an older version's journal must decode), but no path is built for it.
            with pytest.raises(InvalidRunIdError, match="run id"):
                journal_paths(run_id)
            continue
        # Always a suffix, so every accepted id names a plain file in the journal dir.
        journal = journal_paths(run_id).journal
        assert os.path.dirname(os.path.normpath(journal)) == DEFAULT_JOURNAL_DIR, journal
    refused = {run_id for run_id in ADVERSARIAL if id_problem(run_id)}
    assert refused == {"a/b", "../etc/passwd", "..", ".", "$(rm -rf /)", "x\ny", "\x00"}
    assert encode_run_id("🙂") == "_f0_9f_99_82"
    assert encode_run_id("a b") == "a_20b"


def test_windows_device_names_are_fully_escaped() -> None:
    assert encode_run_id("con") == "_63_6f_6e"
    assert encode_run_id("Con") == "_43_6f_6e"
    assert encode_run_id("CON") == "_43_4f_4e"
    for name in ["PRN", "aux", "Nul", "COM1", "com9", "LPT1", "lpt9"]:
        token = encode_run_id(name)
        assert token == "".join(f"_{b:02x}" for b in name.encode()), name
        assert decode_journal_run_id(token + ".ndjson") == Decoded(name)
    for plain in ["console", "COM0", "COM10", "LPT", "con.", "nul-1"]:
        assert encode_run_id(plain) == plain


def test_long_ids_are_capped_with_a_hash_of_the_whole_id() -> None:
    long_id = "x" * 1000
    token = encode_run_id(long_id)
    assert len(token) == 200
    assert token == "x" * 183 + "-" + hashlib.sha256(long_id.encode()).hexdigest()[:16]
    prefix = "p" * 300
    assert encode_run_id(prefix + "a") != encode_run_id(prefix + "b")
    assert encode_run_id("y" * 200) == "y" * 200
    assert len(encode_run_id("y" * 201)) == 200
    # Escapes count towards the cap: 67 emoji are 268 escape characters.
    assert len(encode_run_id("🙂" * 67)) == 200


def test_lone_surrogates_are_refused_clearly() -> None:
    for bad in ["\ud800", "ok\udfff", "a\ud83dz"]:
        with pytest.raises(InvalidRunIdError, match="lone surrogate") as caught:
            encode_run_id(bad)
        assert caught.value.run_id == bad
        with pytest.raises(InvalidRunIdError):
            journal_paths(bad)
    # A proper pair is one code point and fine.
    assert encode_run_id("\U0001f642") == "_f0_9f_99_82"


ids = st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=80)


@settings(max_examples=400, deadline=None)
@given(ids, ids)
def test_encoding_is_injective(a: str, b: str) -> None:
    if a != b:
        assert encode_run_id(a) != encode_run_id(b)


@settings(max_examples=400, deadline=None)
@given(ids)
def test_encoding_round_trips_and_is_filename_safe(run_id: str) -> None:
    token = encode_run_id(run_id)
    assert TOKEN.fullmatch(token)
    if len(token) < 200:
        for suffix in (".ndjson", ".err"):
            assert decode_journal_run_id(token + suffix) == Decoded(run_id)


@settings(max_examples=100, deadline=None)
@given(st.text(min_size=1, max_size=10), st.characters(categories=["Cs"]), st.text(max_size=10))
def test_any_id_with_a_lone_surrogate_is_refused(before: str, surrogate: str, after: str) -> None:
    with pytest.raises(InvalidRunIdError, match="UTF-8"):
        encode_run_id(before + surrogate + after)


# -- R10: the decoder -------------------------------------------------------------------------------


def test_decoder_fails_closed() -> None:
    assert decode_journal_run_id("abc.ndjson") == Decoded("abc")
    assert decode_journal_run_id("a_2fb.err") == Decoded("a/b")
    assert decode_journal_run_id("_4A.ndjson") == Decoded("J")  # upper-case hex accepted
    assert decode_journal_run_id("x.ndjson.ndjson") == Decoded("x.ndjson")
    hashed = encode_run_id("q" * 500)
    assert decode_journal_run_id(hashed + ".ndjson") == Truncated()
    assert decode_journal_run_id("z" * 201 + ".ndjson") == Truncated()
    # Exactly 200 without the hash shape is a real id.
    assert decode_journal_run_id("z" * 200 + ".err") == Decoded("z" * 200)
    assert decode_journal_run_id("z" * 183 + "-" + "A" * 16 + ".err") == Decoded("z" * 183 + "-" + "A" * 16)
    for bad in [
        "_.ndjson",
        "_4.ndjson",
        "ab_4.ndjson",
        "_zz.ndjson",
        "a/b.ndjson",
        "a b.ndjson",
        "a+b.ndjson",
        "abc.json",
        "abc",
        ".ndjson",
        ".err",
        "_ff.ndjson",
        "_ed_a0_80.ndjson",  # an encoded surrogate is not UTF-8
        "_c3.ndjson",  # a cut multi-byte character
        "é.ndjson",
    ]:
        assert decode_journal_run_id(bad) == Malformed(), bad


# -- R12, R13: sentinel and commands ----------------------------------------------------------------


def test_sentinel_line_is_compact_and_ordered() -> None:
    paths = journal_paths("r")
    assert exit_sentinel_line(paths, 0) == '{"__exit":0,"__nonce":"' + paths.nonce + '"}'
    assert list(msgspec.json.decode(exit_sentinel_line(paths, 7))) == ["__exit", "__nonce"]
    with pytest.raises(ValueError):
        exit_sentinel_line(paths, True)


def test_commands_equal_their_templates() -> None:
    p = journal_paths("it's $(x)")
    j = "'/tmp/boxwright-runs/it_27s_20_24_28x_29.ndjson'"
    e = "'/tmp/boxwright-runs/it_27s_20_24_28x_29.err'"
    d = "'/tmp/boxwright-runs'"
    assert journaled_command("my agent 'q'", p) == (
        f"( umask 077 && mkdir -p {d} && : >> {j} && : >> {e} ) && {{ ( my agent 'q' ); "
        f'printf \'{{"__exit":%d,"__nonce":"{p.nonce}"}}\\n\' "$?"; }} >> {j} 2>> {e}'
    )
    assert journal_follow_command(p, 0) == (
        f"umask 077; mkdir -p {d} 2>/dev/null; : >> {j} 2>/dev/null; tail -c +1 -f {j} 2>/dev/null"
    )
    assert journal_follow_command(p, 41).endswith(f"tail -c +42 -f {j} 2>/dev/null")
    assert journal_read_command(p, 0) == f"tail -c +1 {j} 2>/dev/null | base64"
    assert journal_read_command(p, 9) == f"tail -c +10 {j} 2>/dev/null | base64"
    assert journal_exists_command(p) == f"test -f {j}"
    assert journal_stderr_read_command(p) == f"tail -c -4096 {e} 2>/dev/null | base64"
    assert journal_stderr_read_command(p, 10) == f"tail -c -10 {e} 2>/dev/null | base64"
    assert journal_exit_probe_command(p) == f"tail -c -4096 {j} 2>/dev/null | base64"
    f = "'/tmp/boxwright-runs/it_27s_20_24_28x_29.files'"  # the pre-run workspace listing goes with them
    i, q = "'/tmp/boxwright-runs/it_27s_20_24_28x_29.in'", "'/tmp/boxwright-runs/it_27s_20_24_28x_29.fifo'"
    s = "'/tmp/boxwright-runs/it_27s_20_24_28x_29.stdin'"  # the agent's kept stdin
    assert journal_cleanup_command(p) == f"rm -f {j} {e} {f} {s} {i} {q}"  # and a relayed agent's inbox and FIFO
    assert journal_list_command() == f"ls -1 {d} 2>/dev/null"
    assert journal_mtime_list_command("/x y/") == "stat -c '%Y %n' '/x y' '/x y'/* 2>/dev/null"
    hostile = journal_paths("a", "/tmp/it's dir")
    assert journal_cleanup_command(hostile) == (
        "rm -f '/tmp/it'\"'\"'s dir/a.ndjson' '/tmp/it'\"'\"'s dir/a.err' '/tmp/it'\"'\"'s dir/a.files'"
        " '/tmp/it'\"'\"'s dir/a.stdin' '/tmp/it'\"'\"'s dir/a.in' '/tmp/it'\"'\"'s dir/a.fifo'"
    )


def test_command_bounds_are_checked() -> None:
    p = journal_paths("r")
    for bad in (-1, True, 1.0, "3"):
        with pytest.raises(ValueError):
            journal_read_command(p, bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            journal_follow_command(p, bad)  # type: ignore[arg-type]
    for bad_n in (0, -5, False):
        with pytest.raises(ValueError):
            journal_stderr_read_command(p, bad_n)
        with pytest.raises(ValueError):
            journal_exit_probe_command(p, bad_n)


def _sh(command: str) -> int:
    return subprocess.run(["sh", "-c", command], capture_output=True, timeout=20).returncode


def test_the_shell_writes_exactly_the_sentinel_line_even_after_a_bare_exit() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = journal_paths("shell'run", os.path.join(tmp, "j"))
        _sh(journaled_command("echo '{\"a\":1}'; echo warn >&2; exit 7", paths))
        _sh(journaled_command("echo '{\"b\":2}'", paths))
        with open(paths.journal, "rb") as f:
            data = f.read()
        assert data == (
            b'{"a":1}\n'
            + exit_sentinel_line(paths, 7).encode()
            + b"\n"
            + b'{"b":2}\n'
            + exit_sentinel_line(paths, 0).encode()
            + b"\n"
        )
        with open(paths.stderr, "rb") as f:
            assert f.read() == b"warn\n"
        assert parse_journal_exit(data.decode(), paths) == 0


def test_the_journal_is_private_from_its_first_byte_and_the_agent_keeps_its_umask() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        paths = journal_paths("private", os.path.join(tmp, "state", "journals"))
        probe = os.path.join(tmp, "agent-file")
        # The agent reports the modes while it runs: the files exist, private, before it prints a byte.
        agent = f"stat -c %a {paths.dir} {paths.journal} {paths.stderr} >&2; umask >&2; : > {probe}"
        assert _sh(f"umask 022; {journaled_command(agent, paths)}") == 0
        with open(paths.stderr) as f:
            assert f.read().split() == ["700", "600", "600", "0022"]
        assert oct(os.stat(probe).st_mode & 0o777) == "0o644"
        assert oct(os.stat(os.path.dirname(paths.dir)).st_mode & 0o777) == "0o700"


def test_a_handle_names_its_own_journal_dir_else_the_default() -> None:
    class Own:
        journal_dir = "/srv/state/journals/"

    assert journal_dir_of(Own()) == "/srv/state/journals"
    assert journal_dir_of(object()) == DEFAULT_JOURNAL_DIR
    Own.journal_dir = "relative"
    with pytest.raises(ValueError, match="absolute"):
        journal_dir_of(Own())


# -- R15: the sentinel parser -----------------------------------------------------------------------


def test_forged_sentinels_never_count() -> None:
    p = journal_paths("r")
    other = journal_paths("other")
    n = p.nonce
    assert parse_exit_sentinel(exit_sentinel_line(p, 0), p) == 0
    assert parse_exit_sentinel(exit_sentinel_line(p, 255), p) == 255
    assert parse_exit_sentinel(exit_sentinel_line(p, -1), p) == -1
    forged = [
        '{"__exit":0}',
        exit_sentinel_line(other, 0),
        f'{{"__exit":"0","__nonce":"{n}"}}',
        f'{{"__exit":1.5,"__nonce":"{n}"}}',
        f'{{"__exit":7.0,"__nonce":"{n}"}}',
        f'{{"__exit":1e0,"__nonce":"{n}"}}',
        f'{{"__exit":true,"__nonce":"{n}"}}',
        f'{{"__exit":false,"__nonce":"{n}"}}',
        f'{{"__exit":null,"__nonce":"{n}"}}',
        f'{{"__exit":007,"__nonce":"{n}"}}',
        f'{{"__exit": 0,"__nonce":"{n}"}}',
        f'{{"__exit":0, "__nonce":"{n}"}}',
        f' {{"__exit":0,"__nonce":"{n}"}}',
        f'{{"__exit":0,"__nonce":"{n}"}} ',
        f'{{"__exit":0,"__nonce":"{n}"}}\r',
        f'{{"__nonce":"{n}","__exit":0}}',
        f'{{"__exit":0,"__nonce":"{n.upper()}"}}',
        f'{{"__exit":0,"__nonce":"{n}","x":1}}',
        f'{{"__exit":0,"__nonce":"{n}"}}{{}}',
        f'[{{"__exit":0,"__nonce":"{n}"}}]',
        f'{{"__exit":0,"__nonce":{n!r}}}',
        "",
        "not json",
    ]
    for line in forged:
        assert parse_exit_sentinel(line, p) is None, line


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=-(10**6), max_value=10**6), st.text(max_size=8), st.text(max_size=8))
def test_only_the_exact_rendered_line_counts(code: int, before: str, after: str) -> None:
    p = journal_paths("prop")
    line = before + exit_sentinel_line(p, code) + after
    parsed = parse_exit_sentinel(line, p)
    assert parsed == (code if before == after == "" else None)


def test_parse_journal_exit_scans_from_the_end() -> None:
    p = journal_paths("r")
    tail = exit_sentinel_line(p, 0)[5:] + "\n" + '{"a":1}\n'  # a partial first line, as tail -c -N cuts
    assert parse_journal_exit(tail, p) is None
    assert parse_journal_exit("", p) is None
    done = tail + exit_sentinel_line(p, 3) + "\n"
    assert parse_journal_exit(done, p) == 3
    assert parse_journal_exit(exit_sentinel_line(p, 3), p) == 3  # no trailing newline
    # A reused id appends a second run: the last sentinel wins.
    assert parse_journal_exit(done + '{"b":2}\n' + exit_sentinel_line(p, 0) + "\n", p) == 0
    forged_after = done + '{"__exit":0}\n' + exit_sentinel_line(journal_paths("x"), 0) + "\n"
    assert parse_journal_exit(forged_after, p) == 3


# -- R16: the mtime listing -------------------------------------------------------------------------


def test_mtime_listing_needs_its_witness() -> None:
    d = "/tmp/boxwright-runs"
    listed = f"1700000000 {d}\n1700000001 {d}/a.ndjson\n1700000002 {d}/a.err\n"
    assert parse_journal_mtime_listing(listed, d) == Listed(
        (JournalDirEntry("a.ndjson", 1700000001000), JournalDirEntry("a.err", 1700000002000))
    )
    assert parse_journal_mtime_listing(f"1700000000 {d}\n", d + "/") == Listed(())
    assert parse_journal_mtime_listing(f"1700000001 {d}/a.ndjson\n", d) == Unavailable()
    assert parse_journal_mtime_listing("", d) == Unavailable()
    assert parse_journal_mtime_listing(f"1700000000 /tmp/other\n1 {d}/a.ndjson\n", d) == Unavailable()
    junk = (
        f"1700000000 {d}\n"
        f"x1 {d}/bad.ndjson\n"
        f"{d}/nospace\n"
        f"12 {d}/sub/deep.ndjson\n"
        f"13 {d}/\n"
        f"14 /tmp/boxwright-runs-other/x.ndjson\n"
        f"-3 {d}/neg.ndjson\n"
        f"١٢ {d}/arabic-digits.ndjson\n"
        f"stat: cannot stat '{d}/*': No such file or directory\n"
        f"15 {d}/ok.ndjson\n"
    )
    assert parse_journal_mtime_listing(junk, d) == Listed((JournalDirEntry("ok.ndjson", 15000),))


# -- R17: strategy ----------------------------------------------------------------------------------


def _caps(background: bool, killable: bool) -> Capabilities:
    return Capabilities(
        fs=True,
        exec=True,
        env=True,
        ports=False,
        background_processes=background,
        writable_stdin=False,
        killable_processes=killable,
        snapshots=False,
        network_policy=False,
        durable_filesystem=False,
        fork=False,
    )


def test_poll_interval_defaults_to_250_ms() -> None:
    import inspect

    from boxwright.journal import read_journal, read_journal_ndjson

    for reader in (read_journal, read_journal_ndjson):
        assert inspect.signature(reader).parameters["poll_interval_ms"].default == 250


def test_strategy_follows_only_where_background_and_killable() -> None:
    assert journal_read_strategy(_caps(True, True)) == "follow"
    assert journal_read_strategy(_caps(True, False)) == "poll"
    assert journal_read_strategy(_caps(False, True)) == "poll"
    assert journal_read_strategy(_caps(False, False)) == "poll"


# -- R18, R22: framing and line splitting -----------------------------------------------------------


def test_base64_frames_carry_partial_quanta_and_refuse_leftovers() -> None:
    payload = ('{"t":"€ and 🙂"}\n' * 40).encode()
    encoded = base64.encodebytes(payload).decode()  # wrapped at 76 columns
    assert "\n" in encoded.strip()
    assert decode_base64_frame(encoded) == payload
    frame = Base64Frame()
    out = b"".join(frame.feed(encoded[i : i + 7]) for i in range(0, len(encoded), 7))
    frame.end()
    assert out == payload
    assert decode_base64_frame("") == b""
    assert decode_base64_frame(" \n") == b""
    with pytest.raises(JournalFrameError, match="left over"):
        decode_base64_frame(base64.b64encode(b"abcd").decode()[:-2])
    with pytest.raises(JournalFrameError):
        decode_base64_frame("ab!d")


def test_lines_carry_byte_positions_and_withhold_a_partial_tail() -> None:
    splitter = _LineSplitter(10)
    euro = "€".encode()
    assert splitter.feed(b'{"a":"' + euro[:1]) == []
    assert splitter.feed(euro[1:] + b'"}\n{"b"') == [JournalLine('{"a":"€"}', 10 + 11 + 1)]
    assert splitter.feed(b":2}\n\n") == [JournalLine('{"b":2}', 30), JournalLine("", 31)]
    assert splitter.feed(b"partial") == []
    assert splitter.position == 31


# -- errors and wire shapes -------------------------------------------------------------------------


def test_agent_exit_error_message() -> None:
    err = AgentProcessExitError(7, "x" * 5000)
    assert str(err) == "Agent process exited with code 7: " + "x" * 1000
    assert err.exit_code == 7
    assert str(AgentProcessExitError(2)) == "Agent process exited with code 2"


def test_attach_error_names_target_and_reason() -> None:
    err = JournalAttachUnavailableError("run-9", "journal-stalled", "no byte in 300ms")
    assert (err.target, err.reason) == ("run-9", "journal-stalled")
    assert "run-9" in str(err) and "journal-stalled" in str(err) and "300ms" in str(err)


def test_prune_result_is_camel_case_on_the_wire() -> None:
    result = PruneJournalsResult(listed=2, run_ids=1, deleted=["a"], age_gate="listed")
    result.kept.append(KeptJournal(names=("b.ndjson",), reason="non-terminal", run_id="b"))
    wire = msgspec.json.decode(msgspec.json.encode(result))
    assert wire == {
        "listed": 2,
        "runIds": 1,
        "deleted": ["a"],
        "kept": [{"names": ["b.ndjson"], "reason": "non-terminal", "runId": "b"}],
        "ageGate": "listed",
        "failures": [],
    }
