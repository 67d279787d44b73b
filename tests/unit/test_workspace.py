"""Workspace definition, setup plan, instructions text, export parsing, canonical form and hash."""

import hashlib
import json
import subprocess

import pytest

from boxwright.secrets import SecretRef, bearer, create_secrets
from boxwright.setup_shell import parse_exports, sandbox_path
from boxwright.workspace import (
    AgentSkill,
    FileSkill,
    GitAuth,
    GitSource,
    LocalSource,
    NoneSource,
    Parallel,
    Serial,
    build_setup_plan,
    canonical_json,
    define_workspace,
    file_skill,
    git_skill,
    git_skill_dir,
    git_source,
    github_repo,
    instructions_content,
    local_source,
    mcp_skill,
    stable_hash,
    workspace_canonical,
    workspace_hash,
)

# -- A1: sources ---------------------------------------------------------------------------------------


def test_github_repo_expands_shorthand_and_keeps_urls():
    assert github_repo("o/r").url == "https://github.com/o/r.git"
    assert github_repo("https://github.com/o/r").url == "https://github.com/o/r"
    assert github_repo("http://example.com/x.git").url == "http://example.com/x.git"
    assert github_repo("git@github.com:o/r.git").url == "git@github.com:o/r.git"
    src = github_repo("o/r", ref="main", depth=10)
    assert (src.type, src.ref, src.depth, src.auth) == ("git", "main", 10, None)
    assert local_source("/tmp/x") == LocalSource("/tmp/x") and LocalSource("/x").type == "local"
    assert NoneSource().type == "none"


def test_github_repo_secret_becomes_the_git_auth_token():
    secrets = create_secrets({"GH": "tok"})
    src = github_repo("o/r", secret=secrets.GH)
    assert src.auth == GitAuth(SecretRef("GH"))
    assert git_source("https://h/x.git", auth=GitAuth(secrets.GH, username="me")).auth.username == "me"


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: github_repo("not a repo"), "owner/name"),
        (lambda: github_repo("o/r/extra"), "owner/name"),
        (lambda: git_source("https://h/x y.git"), "bad git URL"),
        (lambda: git_source("--upload-pack=evil"), "bad git URL"),
        (lambda: git_source("https://h/x.git", ref="-x"), "bad git ref"),
        (lambda: git_source("https://h/x.git", depth=0), "depth"),
        (lambda: git_source("https://h/x.git", depth=True), "depth"),
        (lambda: git_source("https://h/x.git", depth="shallow"), "depth"),
    ],
)
def test_bad_sources_are_refused_naming_what_is_wrong(call, needle):
    with pytest.raises(ValueError, match=needle):
        call()


def test_git_auth_refuses_a_plain_token():
    with pytest.raises(TypeError, match="SecretRef"):
        git_source("https://h/x.git", auth="ghp_plain")
    with pytest.raises(TypeError, match="SecretRef"):
        git_source("https://h/x.git", auth=GitAuth("ghp_plain"))


def test_unknown_package_manager_names_the_allowed_ones():
    with pytest.raises(ValueError, match="npm, pnpm, yarn, bun, auto") as err:
        define_workspace(source=none_src(), package_manager="pip3000")
    assert "pip3000" in str(err.value)


def none_src():
    return NoneSource()


def test_define_workspace_does_no_io_and_defers_the_setup_callback():
    calls = []
    ws = define_workspace(
        source=local_source("/definitely/not/here"), setup=lambda s: calls.append(s), secrets={"K": "v"}
    )
    assert calls == []
    assert ws.root == "/workspace" and ws.package_manager == "auto" and ws.secrets.keys() == ["K"]
    assert define_workspace().source == NoneSource()
    with pytest.raises(ValueError, match="absolute"):
        define_workspace(root="workspace")
    with pytest.raises(TypeError, match="not one string"):
        define_workspace(setup="npm install")


# -- R4: skills only record data ---------------------------------------------------------------------


def test_skills_record_data_and_leave_secret_refs_unresolved():
    secrets = create_secrets({"GH": "value-never-here"})
    mcp = mcp_skill("m", {"url": "https://m", "headers": {"A": secrets.GH, "B": bearer(secrets.GH), "C": "plain"}})
    assert mcp.config["headers"]["A"] == SecretRef("GH")
    assert mcp.config["headers"]["B"].ref == SecretRef("GH")
    assert "value-never-here" not in repr(mcp) + canonical_json(workspace_canonical(define_workspace(skills=[mcp])))
    assert file_skill("docs/a.md", "x") == FileSkill("docs/a.md", "x")
    for bad in ("/etc/passwd", "../x", "a//b", ""):
        with pytest.raises(ValueError, match="relative"):
            file_skill(bad, "x")
    with pytest.raises(TypeError, match="not a JSON value"):
        mcp_skill("m", {"x": object()})
    with pytest.raises(ValueError, match="absolute"):
        git_skill("o/x", into="relative/dir")


# -- A4: setup plan ------------------------------------------------------------------------------------


def test_setup_plan_from_list_callback_and_none():
    assert build_setup_plan(None) == []
    assert build_setup_plan([]) == []
    assert build_setup_plan(["a", "b"]) == [Serial("a"), Serial("b")]

    def setup(s):
        s.serial("corepack enable")
        s.parallel(["pnpm build", "pnpm typecheck"])
        s.serial("echo done")

    assert build_setup_plan(setup) == [
        Serial("corepack enable"),
        Parallel(("pnpm build", "pnpm typecheck")),
        Serial("echo done"),
    ]


def test_setup_plan_refuses_bad_input():
    with pytest.raises(TypeError, match="non-empty string"):
        build_setup_plan(["ok", ""])
    with pytest.raises(TypeError, match="list of commands"):
        build_setup_plan(lambda s: s.parallel("one string"))
    with pytest.raises(ValueError, match="at least one"):
        build_setup_plan(lambda s: s.parallel([]))

    async def async_setup(s):
        s.serial("x")

    with pytest.raises(TypeError, match="plain function"):
        build_setup_plan(async_setup)


# -- A9 (naming part): git skill directories -----------------------------------------------------------


def test_git_skill_dir_defaults_strips_dot_git_and_into_wins():
    assert git_skill_dir("/workspace", git_skill("o/x")) == "/workspace/.boxwright-skills/x"
    assert git_skill_dir("/workspace", git_skill("https://h/o/y.git")) == "/workspace/.boxwright-skills/y"
    assert git_skill_dir("/workspace", git_skill("git@h:o/z.git")) == "/workspace/.boxwright-skills/z"
    assert git_skill_dir("/srv/app/", git_skill("o/x")) == "/srv/app/.boxwright-skills/x"
    assert git_skill_dir("/workspace", git_skill("o/x", into="/opt/skills")) == "/opt/skills"


# -- A10: AGENTS.md text -------------------------------------------------------------------------------


def test_instructions_beat_the_agents_file_skill_and_scripts_merge_byte_exact():
    skill = file_skill("AGENTS.md", "From the skill.")
    scripts = {"test": "pnpm test", "build": "pnpm build"}
    assert instructions_content(define_workspace(instructions="Use pnpm.", skills=[skill])) == "Use pnpm."
    assert instructions_content(define_workspace(instructions="", skills=[skill])) == "From the skill."
    assert instructions_content(define_workspace(scripts=scripts)) == (
        "## Workspace scripts\n\n- build → pnpm build\n- test → pnpm test"
    )
    assert instructions_content(define_workspace(instructions="Use pnpm.\n\n  \n", scripts=scripts)) == (
        "Use pnpm.\n\n## Workspace scripts\n\n- build → pnpm build\n- test → pnpm test"
    )
    assert instructions_content(define_workspace(skills=[skill], scripts={"t": "x"})) == (
        "From the skill.\n\n## Workspace scripts\n\n- t → x"
    )
    assert instructions_content(define_workspace(scripts={})) is None
    assert instructions_content(define_workspace(skills=[file_skill("other.md", "x")])) is None


# -- export -p parsing ---------------------------------------------------------------------------------


def test_parse_exports_of_dash_bash_and_ansi_c_forms():
    dash = "export A='x y'\nexport B='it'\"'\"'s'\nexport EMPTY=''\nexport ML='l1\nl2'\nexport UNSET\n"
    assert parse_exports(dash) == {"A": "x y", "B": "it's", "EMPTY": "", "ML": "l1\nl2"}
    bash = 'declare -x A="a \\"q\\" \\$HOME \\\\ `x`"\ndeclare -x N\ndeclare -x P="/bin:/usr/bin"\n'
    assert parse_exports(bash) == {"A": 'a "q" $HOME \\ `x`', "P": "/bin:/usr/bin"}
    assert parse_exports("declare -x C=$'tab\\there\\nnl\\x41\\101\\''\n") == {"C": "tab\there\nnlAA'"}
    assert parse_exports("junk line\nexport 1BAD=x\nexport OK=1") == {"OK": "1"}


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_parse_exports_round_trips_real_shell_output(shell):
    values = {"V1": "plain", "V2": "sp ace", "V3": "quote'single\"double", "V4": "line1\nline2", "V5": "$x `y` \\z"}
    env = {"PATH": "/usr/bin:/bin", **values}
    out = subprocess.run([shell, "-c", "export -p"], env=env, capture_output=True, text=True, check=True).stdout
    parsed = parse_exports(out)
    assert {k: parsed[k] for k in values} == values


def test_sandbox_path_maps_the_host_root_back_to_workspace():
    assert sandbox_path("/tmp/bw/abc", "/tmp/bw/abc") == "/workspace"
    assert sandbox_path("/tmp/bw/abc", "/tmp/bw/abc/sub") == "/workspace/sub"
    assert sandbox_path("/tmp/bw/abc", "/tmp/bw/abcd") == "/tmp/bw/abcd"
    assert sandbox_path("/workspace", "/workspace/sub") == "/workspace/sub"


# -- R32: canonical form and hash ----------------------------------------------------------------------

HASH_INPUTS = [
    "",
    "no-workspace",
    "héllo wörld",
    "日本語",
    "😀",
    '\n\t"\\',
    {"b": 1, "a": [True, None, "x"], "é": {"z": "😀", "y": 2}},
    {"😀": 1, "\ufffd": 2, "a": 3},
]


def reference_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


@pytest.mark.parametrize("value", HASH_INPUTS)
def test_stable_hash_is_sha256_of_the_canonical_json(value):
    assert stable_hash(value) == reference_hash(canonical_json(value))
    assert len(stable_hash(value)) == 16


def test_stable_hash_uses_all_64_bits_for_ascii_input():
    # The reference FNV-1a's second lane hashes UTF-16 high bytes, all zero for ASCII, so half its
    # key was constant: keys of different threads would share their last 8 hex digits.
    keys = {stable_hash({"threadId": f"t{i}", "sandboxId": "s"}) for i in range(200)}
    assert len(keys) == 200
    assert len({k[8:] for k in keys}) > 150


def test_canonical_json_is_compact_sorted_by_utf16_and_keeps_non_ascii():
    assert canonical_json({"b": 1, "a": [1.0, 2.5, None], "é": "ü"}) == '{"a":[1,2.5,null],"b":1,"é":"ü"}'
    # U+1F600 is a surrogate pair (0xD83D...), so it sorts before U+FFFD in UTF-16 order.
    assert canonical_json({"\ufffd": 1, "😀": 2}) == '{"😀":2,"\ufffd":1}'
    assert canonical_json("\ud800") == '"\\ud800"'
    assert json.loads(canonical_json({"x": "\u0001\n"})) == {"x": "\u0001\n"}
    for text in ["", "abc", "😀x", "\ud800"]:
        assert stable_hash(text) == reference_hash(canonical_json(text))


def test_workspace_canonical_omits_unset_and_names_secrets():
    secrets = create_secrets({"GH": "s3cr3t-value"})
    ws = define_workspace(
        source=github_repo("o/r", ref="main", secret=secrets.GH),
        secrets=secrets,
        setup=lambda s: (s.serial("a"), s.parallel(["b", "c"])),
        skills=[git_skill("o/skills", secret=secrets.GH), AgentSkill("x")],
    )
    assert workspace_canonical(ws) == {
        "source": {
            "type": "git",
            "url": "https://github.com/o/r.git",
            "ref": "main",
            "auth": {"token": {"secretName": "GH"}},
        },
        "setup": ["a", ["b", "c"]],
        "skills": [
            {"kind": "git", "repo": "o/skills", "secret": {"secretName": "GH"}},
            {"kind": "agent-skill", "name": "x"},
        ],
    }
    assert "s3cr3t" not in canonical_json(workspace_canonical(ws))
    assert workspace_canonical(None) is None
    assert workspace_hash(None) == stable_hash("no-workspace")


def _key(**kw):
    base = {"source": github_repo("o/r", ref="main"), "setup": ["npm ci"], "scripts": {"test": "npm test"}}
    return workspace_hash(define_workspace(**{**base, **kw}))


def test_workspace_hash_is_stable_and_changes_with_what_the_agent_sees():
    # A28, workspace side.
    assert _key() == _key()
    assert _key() == workspace_hash(
        define_workspace(
            source=git_source("https://github.com/o/r.git", ref="main"),
            setup=lambda s: s.serial("npm ci"),
            scripts={"test": "npm test"},
            package_manager="auto",
            root="/workspace/",
        )
    )
    changed = [
        _key(source=github_repo("o/r", ref="dev")),
        _key(source=github_repo("o/r2", ref="main")),
        _key(setup=["npm install"]),
        _key(setup=lambda s: s.parallel(["npm ci"])),
        _key(scripts={"test": "npm run test"}),
        _key(instructions="Be brief."),
        _key(package_manager="pnpm"),
        _key(root="/srv"),
        _key(skills=[file_skill("a.md", "x")]),
        _key(plugins=["p"]),
    ]
    assert len({_key(), *changed}) == len(changed) + 1


def test_workspace_hash_ignores_secret_values_and_hashes_callbacks_by_their_steps():
    a = create_secrets({"GH": "one"})
    b = create_secrets({"GH": "two"})
    assert _key(secrets=a, source=github_repo("o/r", ref="main", secret=a.GH)) == _key(
        secrets=b, source=github_repo("o/r", ref="main", secret=b.GH)
    )
    assert _key(secrets=a) == _key()

    def body_one(s):
        s.serial("npm ci")

    def body_two(s):
        s.serial("npm ci")

    def body_three(s):
        s.serial("npm ci --force")

    assert _key(setup=body_one) == _key(setup=body_two) == _key(setup=["npm ci"])
    assert _key(setup=body_three) != _key(setup=body_one)


def test_git_source_struct_matches_helper_output():
    assert git_source("https://h/x.git") == GitSource("https://h/x.git")
