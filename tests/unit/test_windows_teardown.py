"""LP11: the Windows teardown and ``sh`` rules of the local-process provider, on Linux.

``data/msys_ps.txt`` is git-bash ``ps`` output (CRLF, as git-bash prints it)
of one machine during a sandbox teardown:

- 1829/1830: the user's own mintty and bash (``I``: waiting for tty input),
  1002 an ssh-agent older than a day (STIME ``Mar 12``) -- not ours.
- 1990: an orphan ``sleep`` whose MSYS parent 1987 was ``TerminateProcess``-ed
  earlier, so it still names a PID that is no longer in the table.
- Root A, WINPID 15872: ``sh -c 'cat journal; tail -f journal'`` (a journal
  follow read). The shell forked a middle shell (MSYS pid 2143, Windows pid
  9012) for the last command; it exec'd ``tail`` -- a new Windows process,
  17604 -- and the middle shell's Windows process 9012 exited at once. The
  ``tail`` keeps MSYS pid 2143 and the logical parent 2141, but its Windows
  parent is the dead 9012: ``taskkill /PID 15872 /T`` cannot reach it.
- Root B, WINPID 20344: an agent ``sh`` -> ``node`` (path with a space) ->
  ``bash`` -> ``sleep`` (``S``: stopped), Windows parents all alive.
- 2170: the ``ps`` that printed the table; 4712: a Windows-only row (``ps -W``, PPID 0).
"""

from __future__ import annotations

import asyncio
import ntpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from boxwright.providers._windows import (
    MsysProcess,
    classify_taskkill,
    git_bash_env,
    git_root,
    kill_tree_windows,
    kill_trees_windows,
    msys_descendants,
    parse_msys_ps,
    ps_argv_for,
    resolve_sh,
)

PS_TEXT = (Path(__file__).parent / "data" / "msys_ps.txt").read_bytes().decode()
PS = [r"C:\Program Files\Git\usr\bin\ps.exe"]

ROOT_A = 15872  # sh -c 'cat journal; tail -f journal'
TAIL = 17604  # orphaned in Windows terms: its Windows parent (9012) is gone
ROOT_B = 20344  # sh -> node -> bash -> sleep
NODE, BASH, SLEEP = 20400, 21000, 21012
UNRELATED = {1829, 13412, 5432, 12000, 22012, 4712}

NOT_FOUND = 'ERROR: The process "17604" not found.\r\n'
ACCESS_DENIED = "ERROR: The process with PID 17604 could not be terminated.\r\nReason: Access is denied.\r\n"


# ------------------------------------------------------------------ fakes


class Machine:
    """A fake Windows: live processes by Windows parent, ``ps`` and ``taskkill`` over them.

    ``taskkill /T`` follows live Windows parent links only, like the real one.
    ``ps`` reflects the machine at the time it runs: a killed process's row
    is gone, so a table read after the kill no longer links the orphan to its root.
    """

    def __init__(self, win_parents: Mapping[int, int], ps_text: str) -> None:
        self.win_parents = dict(win_parents)
        self.alive = set(win_parents)
        self.ps_text = ps_text
        self.calls: list[list[str]] = []
        self.denied: set[int] = set()
        self.raise_on: set[int] = set()
        self.ps_result: tuple[int, str] | None = None
        self.ps_raises = False
        self.alive_checks: list[int] = []
        self.exit_after_ps: set[int] = set()

    def _tree(self, pid: int) -> list[int]:
        out, frontier = [pid], [pid]
        while frontier:
            parent = frontier.pop()
            for child, p in self.win_parents.items():
                if p == parent and child in self.alive and child not in out:
                    out.append(child)
                    frontier.append(child)
        return out

    async def run(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(list(argv))
        if argv[0].lower().endswith(("ps", "ps.exe")):
            if self.ps_raises:
                raise OSError("ps.exe: file not found")
            if self.ps_result is not None:
                return self.ps_result[0], "", self.ps_result[1]
            live = [line for line in self.ps_text.splitlines() if (w := _row_winpid(line)) is None or w in self.alive]
            self.alive -= self.exit_after_ps
            return 0, "\r\n".join(live) + "\r\n", ""
        assert argv[:2] == ["taskkill", "/PID"], argv
        pid = int(argv[2])
        if pid in self.raise_on:
            raise OSError("taskkill.exe could not be started")
        if pid not in self.alive:
            return 128, "", f'ERROR: The process "{pid}" not found.\r\n'
        if pid in self.denied:
            return 1, "", f"ERROR: The process with PID {pid} could not be terminated.\r\nReason: Access is denied.\r\n"
        targets = self._tree(pid) if "/T" in argv else [pid]
        for t in targets:
            self.alive.discard(t)
        return 0, "".join(f"SUCCESS: The process with PID {t} has been terminated.\r\n" for t in targets), ""

    async def is_alive(self, winpid: int) -> bool:
        self.alive_checks.append(winpid)
        return winpid in self.alive

    def taskkills(self) -> list[list[str]]:
        return [c for c in self.calls if c[0] == "taskkill"]


def _row_winpid(line: str) -> int | None:
    procs = parse_msys_ps(line)
    return procs[0].winpid if procs else None


# Windows parent pids of the fixture's processes (9012, the middle shell, is dead).
WIN_PARENTS = {
    1829: 1,
    13412: 1829,
    5432: 1,
    12000: 7,
    4712: 1,
    22012: 999,
    ROOT_A: 999,
    TAIL: 9012,
    ROOT_B: 999,
    NODE: ROOT_B,
    BASH: NODE,
    SLEEP: BASH,
}


class Logger:
    def __init__(self) -> None:
        self.warnings: list[tuple[str, dict[str, Any] | None]] = []

    def warn(self, message: str, meta: dict[str, Any] | None = None) -> None:
        self.warnings.append((message, meta))


def machine() -> Machine:
    return Machine(WIN_PARENTS, PS_TEXT)


def tk(pid: int, tree: bool = False) -> list[str]:
    return ["taskkill", "/PID", str(pid), "/T", "/F"] if tree else ["taskkill", "/PID", str(pid), "/F"]


# ------------------------------------------------------------ parse_msys_ps


def test_parse_recorded_table() -> None:
    table = parse_msys_ps(PS_TEXT)
    assert table == [
        MsysProcess(pid=1829, ppid=1, pgid=1829, winpid=1829, command="/usr/bin/mintty"),
        MsysProcess(pid=1830, ppid=1829, pgid=1830, winpid=13412, command="/usr/bin/bash"),
        MsysProcess(pid=1002, ppid=1, pgid=1002, winpid=5432, command="/usr/bin/ssh-agent"),
        MsysProcess(pid=1990, ppid=1987, pgid=1987, winpid=12000, command="/usr/bin/sleep"),
        MsysProcess(pid=2141, ppid=1, pgid=2141, winpid=ROOT_A, command="/usr/bin/sh"),
        MsysProcess(pid=2143, ppid=2141, pgid=2141, winpid=TAIL, command="/usr/bin/tail"),
        MsysProcess(pid=2150, ppid=1, pgid=2150, winpid=ROOT_B, command="/usr/bin/sh"),
        MsysProcess(pid=2152, ppid=2150, pgid=2150, winpid=NODE, command="/c/Program Files/nodejs/node"),
        MsysProcess(pid=2160, ppid=2152, pgid=2160, winpid=BASH, command="/usr/bin/bash"),
        MsysProcess(pid=2161, ppid=2160, pgid=2160, winpid=SLEEP, command="/usr/bin/sleep"),
        MsysProcess(pid=2170, ppid=1, pgid=2170, winpid=22012, command="/usr/bin/ps"),
    ]


def test_parse_is_line_ending_agnostic() -> None:
    lf = PS_TEXT.replace("\r\n", "\n")
    crlf = lf.replace("\n", "\r\n")
    assert "\r\n" in crlf
    assert parse_msys_ps(lf) == parse_msys_ps(crlf) == parse_msys_ps(PS_TEXT)


def test_parse_skips_header_junk_and_ppid_zero() -> None:
    text = "\n".join(
        [
            "      PID    PPID    PGID     WINPID   TTY         UID    STIME COMMAND",
            "",
            "   \t ",
            "ps: unknown option -- x",
            "      abc       1     100       4392  ?         197108 05:20:01 /usr/bin/bash",
            "      100       1     100",  # truncated row
            "    78100       0       0      12564  ?              0 16:23:23 C:\\git\\git.exe",
            "O      7       1       7        70  pty1  197108 05:20:01 /usr/bin/cat",
            "I     102     101     100       2136  ?         197108 05:20:02 /usr/bin/bash",
            "S     103     102     100       2140  ?         197108 05:20:02 /usr/bin/vim",
            "  104   102   100   2150   ?   197108   05:20:03   /usr/bin/less  ",  # odd spacing
        ]
    )
    assert parse_msys_ps(text) == [
        MsysProcess(pid=7, ppid=1, pgid=7, winpid=70, command="/usr/bin/cat"),
        MsysProcess(pid=102, ppid=101, pgid=100, winpid=2136, command="/usr/bin/bash"),
        MsysProcess(pid=103, ppid=102, pgid=100, winpid=2140, command="/usr/bin/vim"),
        MsysProcess(pid=104, ppid=102, pgid=100, winpid=2150, command="/usr/bin/less"),
    ]
    assert parse_msys_ps("") == []


def test_parse_row_without_standard_tail_keeps_rest_as_command() -> None:
    assert parse_msys_ps("  5  1  5  50 something odd") == [
        MsysProcess(pid=5, ppid=1, pgid=5, winpid=50, command="something odd")
    ]
    assert parse_msys_ps("  5  1  5  50") == [MsysProcess(pid=5, ppid=1, pgid=5, winpid=50, command="")]


# --------------------------------------------------------- msys_descendants


def test_descendants_find_the_orphaned_tail() -> None:
    table = parse_msys_ps(PS_TEXT)
    assert [p.winpid for p in msys_descendants(table, ROOT_A)] == [TAIL]


def test_descendants_are_breadth_first_and_exclude_the_root() -> None:
    table = parse_msys_ps(PS_TEXT)
    assert [p.winpid for p in msys_descendants(table, ROOT_B)] == [NODE, BASH, SLEEP]
    wide = [
        MsysProcess(1, 1, 1, 10, "root"),  # self-parented root must not loop
        MsysProcess(2, 1, 1, 20, "a"),
        MsysProcess(3, 1, 1, 30, "b"),
        MsysProcess(4, 2, 1, 40, "a1"),
        MsysProcess(5, 3, 1, 50, "b1"),
    ]
    assert [p.command for p in msys_descendants(wide, 10)] == ["a", "b", "a1", "b1"]


def test_descendants_unknown_root_and_leaf() -> None:
    table = parse_msys_ps(PS_TEXT)
    assert msys_descendants(table, 424242) == []
    assert msys_descendants(table, TAIL) == []
    assert msys_descendants([], ROOT_A) == []


def test_descendants_orphan_of_an_absent_parent_is_not_reached() -> None:
    table = parse_msys_ps(PS_TEXT)
    reached = {p.winpid for root in (ROOT_A, ROOT_B, 1829) for p in msys_descendants(table, root)}
    assert 12000 not in reached  # its parent 1987 is not in the table
    assert 22012 not in reached  # ps itself


def test_descendants_are_cycle_safe() -> None:
    cyclic = [
        MsysProcess(pid=1, ppid=1, pgid=1, winpid=100, command="root"),
        MsysProcess(pid=2, ppid=3, pgid=1, winpid=200, command="a"),
        MsysProcess(pid=3, ppid=2, pgid=1, winpid=300, command="b"),
        MsysProcess(pid=4, ppid=1, pgid=1, winpid=400, command="c"),
        MsysProcess(pid=5, ppid=4, pgid=1, winpid=500, command="d"),
        MsysProcess(pid=6, ppid=5, pgid=1, winpid=600, command="e"),
    ]
    # 2 <-> 3 is a cycle unreachable from the root; 1 is its own parent.
    assert [p.winpid for p in msys_descendants(cyclic, 100)] == [400, 500, 600]
    # A cycle through the root: 4 -> 5 -> 6 -> 1 (root).
    through_root = [*cyclic[3:], MsysProcess(pid=1, ppid=6, pgid=1, winpid=100, command="root")]
    assert [p.winpid for p in msys_descendants(through_root, 100)] == [400, 500, 600]
    # Starting inside the 2 <-> 3 cycle.
    assert [p.winpid for p in msys_descendants(cyclic, 200)] == [300]


def test_descendants_several_rows_with_the_root_winpid() -> None:
    table = [
        MsysProcess(pid=10, ppid=1, pgid=10, winpid=7000, command="sh"),
        MsysProcess(pid=11, ppid=1, pgid=11, winpid=7000, command="sh (stale row, same WINPID)"),
        MsysProcess(pid=12, ppid=10, pgid=10, winpid=7100, command="cat"),
        MsysProcess(pid=13, ppid=11, pgid=11, winpid=7200, command="tail"),
        MsysProcess(pid=14, ppid=12, pgid=10, winpid=7000, command="exec stub sharing the root WINPID"),
        MsysProcess(pid=15, ppid=14, pgid=10, winpid=7300, command="grandchild"),
    ]
    assert [p.winpid for p in msys_descendants(table, 7000)] == [7100, 7200, 7300]


# --------------------------------------------------------- classify_taskkill


@pytest.mark.parametrize(
    ("exit_code", "stderr", "expected"),
    [
        (0, "", "killed"),
        (0, "ERROR: something odd but it exited 0", "killed"),
        (128, "", "gone"),
        (128, "ERROR: Access is denied.", "gone"),
        (128, 'ERROR: The process "4242" not found.\r\n', "gone"),
        (1, 'ERROR: The process "4242" not found.\r\n', "gone"),
        (1, "ERROR: The process 4242 does not exist.", "gone"),
        (
            255,
            "ERROR: The process with PID 4242 (child process of PID 4000) could not be terminated.\r\n"
            "Reason: There is no running instance of the task.\r\n",
            "gone",
        ),
        (1, 'error: the process "4242" NOT FOUND.', "gone"),
        (
            255,
            'ERROR: The process "4242" not found.\r\n'
            "ERROR: The process with PID 4243 (child process of PID 4000) could not be terminated.\r\n"
            "Reason: There is no running instance of the task.\r\n",
            "gone",
        ),
        (1, "ERROR: The process with PID 4242 could not be terminated.\r\nReason: Access is denied.\r\n", "failed"),
        (
            255,
            'ERROR: The process "4243" not found.\r\n'
            "ERROR: The process with PID 4242 (child process of PID 4000) could not be terminated.\r\n"
            "Reason: Access is denied.\r\n",
            "failed",
        ),
        (1, "", "failed"),
        (-1, "   \r\n", "failed"),
        (1, "FEHLER: Zugriff verweigert", "failed"),
    ],
)
def test_classify_taskkill(exit_code: int, stderr: str, expected: str) -> None:
    assert classify_taskkill(exit_code, stderr) == expected


# --------------------------------------------------------- kill_tree_windows


def test_orphaned_tail_is_killed_after_the_tree() -> None:
    m, log = machine(), Logger()
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert m.alive_checks == [TAIL]
    assert TAIL not in m.alive and ROOT_A not in m.alive
    assert log.warnings == []


def test_taskkill_tree_alone_would_leave_the_tail() -> None:
    """The premise: /T exits 0 and the tail survives; a table read afterwards no longer links it."""
    m = machine()
    code, _out, _err = asyncio.run(m.run(tk(ROOT_A, tree=True)))
    assert code == 0 and TAIL in m.alive
    _code, after, _err = asyncio.run(m.run(PS))
    assert msys_descendants(parse_msys_ps(after), ROOT_A) == []


def test_snapshot_is_taken_before_killing() -> None:
    m = machine()
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=None, ps_argv=PS))
    assert m.calls[0] == PS
    assert tk(TAIL) in m.calls


def test_live_descendants_are_left_to_taskkill_tree() -> None:
    m, log = machine(), Logger()
    asyncio.run(kill_tree_windows(ROOT_B, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_B, tree=True)]
    assert m.alive_checks == [NODE, BASH, SLEEP]
    assert not {ROOT_B, NODE, BASH, SLEEP} & m.alive
    assert log.warnings == []


def test_batch_takes_one_snapshot() -> None:
    m, log = machine(), Logger()
    asyncio.run(kill_trees_windows([ROOT_A, ROOT_B, ROOT_A], run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(ROOT_B, tree=True), tk(TAIL)]
    assert [c for c in m.calls if c == PS] == [PS]
    assert m.alive == UNRELATED
    assert log.warnings == []


def test_empty_batch_does_nothing() -> None:
    m = machine()
    asyncio.run(kill_trees_windows([], run=m.run, is_alive=m.is_alive, logger=Logger(), ps_argv=PS))
    assert m.calls == []


def test_without_is_alive_every_descendant_is_killed_and_gone_is_silent() -> None:
    m, log = machine(), Logger()
    asyncio.run(kill_trees_windows([ROOT_A, ROOT_B], run=m.run, is_alive=None, logger=log, ps_argv=PS))
    assert m.calls == [
        PS,
        tk(ROOT_A, tree=True),
        tk(ROOT_B, tree=True),
        tk(TAIL),
        tk(NODE),
        tk(BASH),
        tk(SLEEP),
    ]
    assert m.alive == UNRELATED
    assert log.warnings == []  # node/bash/sleep answered 128 "not found": already exited


def test_root_that_already_exited_is_silent_and_its_orphan_still_swept() -> None:
    m, log = machine(), Logger()
    m.exit_after_ps.add(ROOT_A)  # the journal shell exits on its own just after the snapshot; its tail does not
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert TAIL not in m.alive
    assert log.warnings == []


def test_root_gone_before_the_snapshot_gets_only_the_tree_kill() -> None:
    """Its row has left the table, so nothing links to it any more: /T (answered "not found") is all there is."""
    m, log = machine(), Logger()
    m.alive.discard(ROOT_A)
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True)]
    assert log.warnings == []


def test_descendant_exiting_between_check_and_kill_is_silent() -> None:
    m, log = machine(), Logger()

    async def stale_is_alive(winpid: int) -> bool:
        m.alive.discard(winpid)  # exits right after we looked
        return True

    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=stale_is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert log.warnings == []


def test_root_failure_is_warned_with_stderr_and_sweep_continues() -> None:
    m, log = machine(), Logger()
    m.denied.add(ROOT_A)
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert len(log.warnings) == 1
    message, meta = log.warnings[0]
    assert "taskkill" in message
    assert meta is not None
    assert meta["winpid"] == ROOT_A and meta["exit_code"] == 1
    assert "Access is denied" in meta["stderr"]


def test_surviving_descendant_is_warned() -> None:
    m, log = machine(), Logger()
    m.denied.add(TAIL)
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert len(log.warnings) == 1
    message, meta = log.warnings[0]
    assert "survived" in message
    assert meta is not None
    [survivor] = meta["survivors"]
    assert survivor["winpid"] == TAIL and survivor["pid"] == 2143
    assert survivor["command"] == "/usr/bin/tail" and survivor["root_winpid"] == ROOT_A
    assert "Access is denied" in survivor["stderr"]


def test_run_raising_becomes_a_warning() -> None:
    m, log = machine(), Logger()
    m.raise_on.update({ROOT_A, TAIL})
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    assert [w[0] for w in log.warnings] == [
        "taskkill could not kill the process tree",
        "descendant processes survived teardown",
    ]
    assert all("could not be started" in repr(w[1]) for w in log.warnings)


def test_unreadable_table_is_warned_and_tree_still_killed() -> None:
    for setup in ("exit", "raise"):
        m, log = machine(), Logger()
        if setup == "exit":
            m.ps_result = (1, "ps: cannot open process table")
        else:
            m.ps_raises = True
        asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=log, ps_argv=PS))
        assert m.calls == [PS, tk(ROOT_A, tree=True)]
        assert len(log.warnings) == 1
        assert "process table" in log.warnings[0][0]


def test_never_raises_with_broken_collaborators() -> None:
    m = machine()
    m.denied.update({ROOT_A, TAIL})

    class BrokenLogger:
        def warn(self, message: str, meta: dict[str, Any] | None = None) -> None:
            raise RuntimeError("log sink down")

    async def broken_is_alive(winpid: int) -> bool:
        raise RuntimeError("OpenProcess failed")

    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=broken_is_alive, logger=BrokenLogger(), ps_argv=PS))
    # an is_alive failure counts as alive: the kill is still attempted
    assert m.calls == [PS, tk(ROOT_A, tree=True), tk(TAIL)]
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=None, logger=None, ps_argv=PS))


def test_unrelated_processes_are_never_touched() -> None:
    m = machine()
    asyncio.run(kill_trees_windows([ROOT_A, ROOT_B], run=m.run, is_alive=None, logger=None, ps_argv=PS))
    touched = {int(c[2]) for c in m.taskkills()}
    assert not touched & UNRELATED


def test_nested_roots_are_killed_once() -> None:
    m, log = machine(), Logger()
    asyncio.run(kill_trees_windows([ROOT_B, BASH], run=m.run, is_alive=None, logger=log, ps_argv=PS))
    # BASH is a root of its own: it gets its /T (answered "not found", silent), never a second /F.
    assert m.calls == [PS, tk(ROOT_B, tree=True), tk(BASH, tree=True), tk(NODE), tk(SLEEP)]
    assert log.warnings == []


def test_default_ps_argv() -> None:
    m = machine()
    asyncio.run(kill_tree_windows(ROOT_A, run=m.run, is_alive=m.is_alive, logger=None))
    assert m.calls[0] == ["ps"]


# ------------------------------------------------------------------ resolve_sh

GIT = r"C:\Program Files\Git"
USR_SH = GIT + r"\usr\bin\sh.exe"
BIN_SH = GIT + r"\bin\sh.exe"


def existing(*paths: str) -> Any:
    known = {ntpath.normcase(p) for p in paths}
    return lambda p: ntpath.normcase(p) in known


def test_override_wins_without_existence_check() -> None:
    env = {"BOXWRIGHT_SANDBOX_SH": r"D:\tools\busybox\sh.exe", "Path": GIT + r"\cmd"}
    assert resolve_sh(env, existing(USR_SH)) == r"D:\tools\busybox\sh.exe"
    assert resolve_sh({"boxwright_sandbox_sh": "bash"}, existing()) == "bash"
    assert resolve_sh({"BOXWRIGHT_SANDBOX_SH": "  "}, existing(USR_SH)) == USR_SH


@pytest.mark.parametrize("key", ["Path", "PATH", "path"])
def test_path_git_cmd_entry(key: str) -> None:
    git = r"D:\Apps\Git"
    env = {key: rf"C:\Windows\system32;{git}\cmd;C:\Windows"}
    assert resolve_sh(env, existing(git + r"\usr\bin\sh.exe", git + r"\bin\sh.exe")) == git + r"\usr\bin\sh.exe"
    assert resolve_sh(env, existing(git + r"\bin\sh.exe")) == git + r"\bin\sh.exe"


def test_path_entry_variants() -> None:
    git = r"E:\dev\git"
    for entry in (rf"{git}\CMD\\", f'"{git}\\cmd"', "E:/dev/git/cmd", f"  {git}\\cmd  "):
        assert resolve_sh({"Path": entry}, existing(git + r"\usr\bin\sh.exe")) == git + r"\usr\bin\sh.exe", entry


def test_first_usable_path_entry_wins() -> None:
    env = {"Path": r"C:\Old\Git\cmd;D:\New\Git\cmd"}
    assert resolve_sh(env, existing(r"C:\Old\Git\usr\bin\sh.exe", r"D:\New\Git\usr\bin\sh.exe")) == (
        r"C:\Old\Git\usr\bin\sh.exe"
    )
    # the first entry's install is broken: fall through to the next
    assert resolve_sh(env, existing(r"D:\New\Git\bin\sh.exe")) == r"D:\New\Git\bin\sh.exe"


def test_portable_git_cmd_dir_is_recognised_by_git_exe() -> None:
    port = r"C:\Users\me\scoop\apps\git\current"
    env = {"Path": port + r"\cmd;C:\tools\cmd"}
    exists = existing(port + r"\cmd\git.exe", port + r"\usr\bin\sh.exe", r"C:\tools\usr\bin\sh.exe")
    assert resolve_sh(env, exists) == port + r"\usr\bin\sh.exe"
    # a cmd dir without git.exe is not a git install
    assert resolve_sh({"Path": r"C:\tools\cmd"}, exists) == "sh"


def test_non_git_path_entries_are_ignored() -> None:
    env = {"Path": r"C:\Program Files\Git\mingw64\bin;C:\msys64\usr\bin"}
    assert resolve_sh(env, existing(r"C:\msys64\usr\bin\sh.exe")) == "sh"


def test_program_files_defaults() -> None:
    assert resolve_sh({}, existing(USR_SH, BIN_SH)) == USR_SH
    assert resolve_sh({}, existing(BIN_SH)) == BIN_SH
    assert resolve_sh({}, existing(r"C:\Program Files (x86)\Git\bin\sh.exe")) == (
        r"C:\Program Files (x86)\Git\bin\sh.exe"
    )
    env = {"ProgramFiles": r"D:\Programs", "Path": r"C:\Windows"}
    assert resolve_sh(env, existing(r"D:\Programs\Git\usr\bin\sh.exe", USR_SH)) == r"D:\Programs\Git\usr\bin\sh.exe"
    # PATH comes before Program Files
    env = {"Path": r"D:\Other\Git\cmd"}
    assert resolve_sh(env, existing(USR_SH, r"D:\Other\Git\bin\sh.exe")) == r"D:\Other\Git\bin\sh.exe"


def test_fallback_is_plain_sh() -> None:
    assert resolve_sh({}, existing()) == "sh"
    assert resolve_sh({"Path": GIT + r"\cmd"}, existing()) == "sh"


def test_resolution_order_is_probed_in_order() -> None:
    probed: list[str] = []

    def exists(p: str) -> bool:
        probed.append(p)
        return False

    resolve_sh({"Path": r"X:\Git\cmd", "ProgramFiles": r"C:\Program Files"}, exists)
    assert probed == [
        r"X:\Git\usr\bin\sh.exe",
        r"X:\Git\bin\sh.exe",
        r"C:\Program Files\Git\usr\bin\sh.exe",
        r"C:\Program Files\Git\bin\sh.exe",
        r"C:\Program Files (x86)\Git\usr\bin\sh.exe",
        r"C:\Program Files (x86)\Git\bin\sh.exe",
    ]


# -------------------------------------------------------------- git_bash_env

FRONT = [GIT + r"\usr\bin", GIT + r"\bin", GIT + r"\mingw64\bin"]


def test_git_bash_env_keeps_key_casing() -> None:
    env = {"Path": r"C:\Windows\system32;C:\Windows", "USERPROFILE": r"C:\Users\me"}
    out = git_bash_env(env, USR_SH)
    assert list(out) == ["Path", "USERPROFILE"]
    assert out["Path"] == ";".join([*FRONT, r"C:\Windows\system32", r"C:\Windows"])
    assert out["USERPROFILE"] == r"C:\Users\me"
    assert env["Path"] == r"C:\Windows\system32;C:\Windows"  # input untouched
    assert "PATH" not in out
    assert git_bash_env({"path": "X"}, USR_SH) == {"path": ";".join([*FRONT, "X"])}


def test_git_bash_env_from_bin_sh_and_missing_path() -> None:
    assert git_bash_env({}, BIN_SH) == {"PATH": ";".join(FRONT)}
    assert git_bash_env({"PATH": ""}, BIN_SH) == {"PATH": ";".join(FRONT)}


def test_git_bash_env_is_idempotent() -> None:
    once = git_bash_env({"Path": r"C:\Windows;" + GIT.lower() + "\\bin\\"}, USR_SH)
    assert once["Path"] == ";".join([*FRONT, r"C:\Windows"])
    assert git_bash_env(once, USR_SH) == once


def test_git_bash_env_folds_case_variants() -> None:
    out = git_bash_env({"Path": r"C:\A", "PATH": r"C:\B"}, USR_SH)
    assert out == {"Path": ";".join([*FRONT, r"C:\A", r"C:\B"])}


def test_git_bash_env_bare_sh_is_unchanged() -> None:
    env = {"Path": r"C:\Windows"}
    out = git_bash_env(env, "sh")
    assert out == env and out is not env


def test_git_root_and_ps_argv() -> None:
    assert git_root(USR_SH) == GIT
    assert git_root(BIN_SH) == GIT
    assert git_root("C:/Program Files/Git/usr/bin/sh.exe") == GIT
    assert git_root("sh") is None
    assert git_root(r"D:\tools\sh.exe") is None
    assert ps_argv_for(USR_SH) == [GIT + r"\usr\bin\ps.exe"]
    assert ps_argv_for(BIN_SH) == [GIT + r"\usr\bin\ps.exe"]
    assert ps_argv_for("sh") == ["ps"]
