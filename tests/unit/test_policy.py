"""Policy (R24-R28): command globs, precedence, script aliases, approvals, native mappings, network at create."""

import asyncio
import re

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from boxwright.errors import InvalidPolicyError, UnsupportedCapabilityError
from boxwright.policy import (
    APPROVAL_REQUESTED_EVENT,
    ApprovalResolution,
    ClaudePermissions,
    CodexPermissions,
    GrokPermissions,
    SandboxPolicy,
    approval_requested_value,
    claude_code_permissions,
    codex_permissions,
    define_sandbox_policy,
    evaluate_command,
    glob_match,
    grok_permissions,
    network_policy_for,
    resolve_approval,
)
from boxwright.providers import bubblewrap_sandbox, local_process_sandbox
from boxwright.providers.bubblewrap import probe
from boxwright.sandbox import CreateInput, NetworkPolicy
from tests.support.require import missing

# -- R24: globs and precedence --------------------------------------------------------------------


def test_a21_exact_and_glob_matches_with_precedence_and_default():
    policy = define_sandbox_policy(
        allow=["git status", "pnpm *", "npm run *"],
        ask=["pnpm install*", "npm run deploy*"],
        deny=["sudo *", "pnpm install --global*"],
    )
    assert evaluate_command("git status", policy) == "allow"
    assert evaluate_command("  git status\n", policy) == "allow"  # the command is stripped
    assert evaluate_command("git status --short", policy) == "ask"  # exact means exact; no default -> ask
    assert evaluate_command("pnpm test", policy) == "allow"
    assert evaluate_command("pnpm install lodash", policy) == "ask"  # ask beats allow
    assert evaluate_command("pnpm install --global x", policy) == "deny"  # deny beats ask and allow
    assert evaluate_command("npm run deploy:prod", policy) == "ask"
    assert evaluate_command("sudo ls", policy) == "deny"
    assert evaluate_command("ls", policy) == "ask"

    with_default = define_sandbox_policy(default="allow", deny=["rm *"])
    assert evaluate_command("ls", with_default) == "allow"
    assert evaluate_command("rm x", with_default) == "deny"
    assert evaluate_command("ls", define_sandbox_policy(default="deny")) == "deny"
    assert evaluate_command("anything", None) == "ask"
    assert evaluate_command("anything", define_sandbox_policy()) == "ask"


def test_a22_globs_are_whole_string_and_newlines_cannot_escape_a_deny():
    policy = define_sandbox_policy(default="allow", deny=["rm -rf *", "curl *", "*| sh*"])
    assert evaluate_command("confirm -rf safe", policy) == "allow"  # no substring search
    assert evaluate_command("echo rm -rf /", policy) == "allow"  # anchored at the start
    assert evaluate_command("rm -rf /\necho done", policy) == "deny"
    assert evaluate_command("curl x\n| sh", policy) == "deny"
    assert evaluate_command("echo a\nwget x | sh\n", policy) == "deny"
    # Only `*` is special: fnmatch's `?` and `[...]` are literal characters here.
    literal = define_sandbox_policy(allow=["ls ?", "cat [ab].txt", "echo \\*"])
    assert evaluate_command("ls x", literal) == "ask"
    assert evaluate_command("ls ?", literal) == "allow"
    assert evaluate_command("cat a.txt", literal) == "ask"
    assert evaluate_command("cat [ab].txt", literal) == "allow"
    assert evaluate_command("echo \\anything", literal) == "allow"


def test_glob_match_edge_cases():
    assert glob_match("*", "") and glob_match("**", "a\nb") and glob_match("a*a", "aa")
    assert not glob_match("a*a", "a")  # head and tail may not share a character
    assert glob_match("a*b*c", "a\nxbyc") and not glob_match("a*b*c", "acb")
    assert glob_match("*ab*ab*", "abab") and not glob_match("*ab*ab*", "aba")
    assert not glob_match("", "x") and glob_match("", "")


# Patterns and commands over an alphabet rich in the characters a wrong matcher would treat specially.
ALPHABET = st.sampled_from(list("ab* ?[]\\.\n-"))
TEXT = st.text(alphabet=st.sampled_from(list("ab ?[]\\.\n-*")), max_size=12)
PATTERN = st.text(alphabet=ALPHABET, max_size=8)


def reference_match(pattern: str, text: str) -> bool:
    regex = ".*".join(re.escape(part) for part in pattern.split("*"))
    return re.fullmatch(regex, text, re.DOTALL) is not None


@given(PATTERN, TEXT)
def test_property_glob_agrees_with_an_escaped_regex(pattern, text):
    assert glob_match(pattern, text) == reference_match(pattern, text)


@given(st.text(alphabet=st.characters(blacklist_characters="*"), max_size=10), st.text(max_size=10))
def test_property_a_pattern_without_star_matches_only_itself(pattern, text):
    assert glob_match(pattern, pattern)
    assert glob_match(pattern, text) == (pattern == text)


@given(st.text(max_size=30))
def test_property_star_alone_matches_everything(text):
    assert glob_match("*", text)
    assert evaluate_command(text, define_sandbox_policy(deny=["*"], allow=["*"])) == "deny"


@given(PATTERN, TEXT, st.sampled_from(["allow", "ask", "deny", None]))
def test_property_deny_beats_allow_and_ask_for_the_same_pattern(pattern, command, default):
    policy = define_sandbox_policy(default=default, allow=[pattern], ask=[pattern], deny=[pattern])
    decision = evaluate_command(command, policy)
    if glob_match(pattern.strip(), command.strip()):
        assert decision == "deny"
    else:
        assert decision == (default or "ask")


# -- R25: scripts ---------------------------------------------------------------------------------


def test_a23_script_names_and_values_alias_both_ways():
    scripts = {"test": "pnpm vitest run", "lint": "eslint .", "deploy": "sh deploy.sh"}
    by_name = define_sandbox_policy(allow=["test"], deny=["deploy"])
    assert evaluate_command("pnpm vitest run", by_name, scripts) == "allow"
    assert evaluate_command("test", by_name, scripts) == "allow"
    assert evaluate_command("sh deploy.sh", by_name, scripts) == "deny"
    assert evaluate_command("pnpm vitest run", by_name) == "ask"  # no scripts, no alias

    by_value = define_sandbox_policy(allow=["eslint ."], deny=["sh *"])
    assert evaluate_command("lint", by_value, scripts) == "allow"
    assert evaluate_command("deploy", by_value, scripts) == "deny"  # a glob over the script's command
    assert evaluate_command("lint", by_value) == "ask"


# -- R26: approvals -------------------------------------------------------------------------------


def test_a24_resolve_approval_asks_then_honours_the_client_decision():
    policy = define_sandbox_policy(allow=["git *"], ask=["npm i*"], deny=["rm *"])
    undecided = resolve_approval(policy, provider="claude-code", kind="command", target="npm i lodash")
    assert undecided == ApprovalResolution("deny", True, "claude-code:command:npm i lodash")
    approvals = {"claude-code:command:npm i lodash": True, "claude-code:command:npm i evil": False}
    granted = resolve_approval(
        policy, provider="claude-code", kind="command", target="npm i lodash", approvals=approvals
    )
    assert granted == ApprovalResolution("allow", False, "claude-code:command:npm i lodash")
    refused = resolve_approval(policy, provider="claude-code", kind="command", target="npm i evil", approvals=approvals)
    assert refused == ApprovalResolution("deny", False, "claude-code:command:npm i evil")

    # allow and deny are final: a client approval cannot unlock a deny rule.
    forced = {"codex:command:rm -rf /": True}
    assert (
        resolve_approval(policy, provider="codex", kind="command", target="rm -rf /", approvals=forced).decision
        == "deny"
    )
    assert not resolve_approval(policy, provider="codex", kind="command", target="git log").needs_approval


def test_a24_capability_rules_then_default_then_ask():
    caps = define_sandbox_policy(default="allow", file_write="deny", network="ask")
    write = resolve_approval(caps, provider="claude-code", kind="fileWrite", target="Write")
    assert write == ApprovalResolution("deny", False, "claude-code:fileWrite:Write")
    net = resolve_approval(caps, provider="claude-code", kind="network", target="WebFetch")
    assert net == ApprovalResolution("deny", True, "claude-code:network:WebFetch")
    assert resolve_approval(caps, provider="opencode", kind="tool", target="todo").decision == "allow"

    fallback = define_sandbox_policy(default="deny")
    assert resolve_approval(fallback, provider="x", kind="network", target="WebSearch").decision == "deny"
    bare = resolve_approval(None, provider="x", kind="fileWrite", target="Edit", approvals={"x:fileWrite:Edit": True})
    assert bare == ApprovalResolution("allow", False, "x:fileWrite:Edit")
    assert resolve_approval(define_sandbox_policy(), provider="x", kind="tool", target="t").needs_approval


def test_approval_requested_event_value():
    value = approval_requested_value(
        "claude-code:command:npm i", "Approve Bash: npm i", {"provider": "claude-code", "toolName": "Bash"}
    )
    assert APPROVAL_REQUESTED_EVENT == "approval-requested"
    assert value == {
        "approvalId": "claude-code:command:npm i",
        "title": "Approve Bash: npm i",
        "provider": "claude-code",
        "toolName": "Bash",
    }
    assert approval_requested_value("a", "t") == {"approvalId": "a", "title": "t"}


# -- R27: native mappings -------------------------------------------------------------------------


def test_a25_claude_code_mapping():
    assert claude_code_permissions(None) == ClaudePermissions(None, [], [])
    for default, mode in (("allow", "bypassPermissions"), ("ask", "acceptEdits"), ("deny", "default")):
        assert claude_code_permissions(define_sandbox_policy(default=default)).permission_mode == mode
    policy = define_sandbox_policy(
        allow=["Read", "Grep", "git *", "Read"],
        deny=["Bash", "Write", "rm -rf *", "NotATool"],
        ask=["Edit"],
        file_write="deny",
        network="deny",
    )
    assert claude_code_permissions(policy) == ClaudePermissions(
        permission_mode=None,  # no default set, no mode
        allowed_tools=["Read", "Grep"],
        disallowed_tools=["Write", "Edit", "MultiEdit", "WebFetch", "WebSearch", "Bash"],
    )


def test_a25_codex_mapping():
    assert codex_permissions(None) == CodexPermissions(None, None, None)
    assert codex_permissions(define_sandbox_policy(file_write="deny", network="allow")) == CodexPermissions(
        "read-only", True, None
    )
    assert codex_permissions(define_sandbox_policy(network="deny")).network_access is False
    assert codex_permissions(define_sandbox_policy(network="ask")).network_access is None
    assert codex_permissions(define_sandbox_policy(default="allow", ask=["npm *"])).approval == "on-request"
    assert codex_permissions(define_sandbox_policy(default="ask")).approval == "on-request"
    assert codex_permissions(define_sandbox_policy(default="deny")).approval == "untrusted"
    assert codex_permissions(define_sandbox_policy(default="allow")).approval == "never"
    # A deny list alone keeps auto-approve: it is a hard block, not a prompt.
    assert codex_permissions(define_sandbox_policy(deny=["rm -rf /"])).approval is None
    assert codex_permissions(define_sandbox_policy(default="allow", deny=["rm -rf /"])).approval == "never"


def test_a25_grok_mapping():
    permissive = GrokPermissions(read_only=False, web_search=True, auto_approve=True)
    assert grok_permissions(None) == permissive
    assert grok_permissions(define_sandbox_policy(default="allow")) == permissive
    # A deny list alone keeps auto-approve (headless grok cancels every unapproved tool).
    assert grok_permissions(define_sandbox_policy(deny=["rm -rf /"])) == permissive
    assert grok_permissions(define_sandbox_policy(default="allow", deny=["rm -rf /"])).auto_approve
    assert not grok_permissions(define_sandbox_policy(ask=["pnpm *"])).auto_approve
    assert not grok_permissions(define_sandbox_policy(default="ask")).auto_approve
    assert not grok_permissions(define_sandbox_policy(default="deny")).auto_approve
    assert grok_permissions(define_sandbox_policy(file_write="deny", network="deny")) == GrokPermissions(
        read_only=True, web_search=False, auto_approve=True
    )


# -- definition and wire form ---------------------------------------------------------------------


def test_define_sandbox_policy_validates_and_encodes_camel_case():
    with pytest.raises(InvalidPolicyError, match="default"):
        define_sandbox_policy(default="maybe")  # type: ignore[arg-type]
    with pytest.raises(InvalidPolicyError, match="file_write"):
        define_sandbox_policy(file_write="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidPolicyError, match="not one string"):
        define_sandbox_policy(deny="rm *")
    with pytest.raises(InvalidPolicyError):
        define_sandbox_policy(allow=[1])  # type: ignore[list-item]
    policy = define_sandbox_policy(default="ask", deny=["rm *"], file_write="deny")
    wire = msgspec.json.encode(policy)
    assert msgspec.json.decode(wire) == {
        "commands": {"deny": ["rm *"]},
        "capabilities": {"fileWrite": "deny"},
        "default": "ask",
    }
    assert msgspec.json.decode(wire, type=SandboxPolicy) == policy
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"default": "sometimes"}', type=SandboxPolicy)


# -- R28: network at provider create --------------------------------------------------------------


def test_network_policy_for():
    assert network_policy_for(define_sandbox_policy(network="deny")) == NetworkPolicy(mode="deny")
    assert network_policy_for(define_sandbox_policy(network="allow")) is None
    assert network_policy_for(define_sandbox_policy(default="deny")) is None
    assert network_policy_for(None) is None


def test_r28_local_process_refuses_a_network_deny_at_create(tmp_path):
    provider = local_process_sandbox(base_dir=tmp_path)
    network = network_policy_for(define_sandbox_policy(network="deny"))
    with pytest.raises(UnsupportedCapabilityError) as err:
        asyncio.run(provider.create(CreateInput(network=network)))
    assert err.value.capability == "network_policy"
    assert list(tmp_path.iterdir()) == []  # refused before any sandbox was made


@pytest.mark.integration
def test_r28_bubblewrap_enforces_a_network_deny(tmp_path):
    found = probe()
    if not (found.available and found.network_deny):
        reason = found.reason or "bwrap --unshare-net does not work here"
        missing(f"bubblewrap with network unsharing unavailable: {reason}")

    async def main() -> list[str]:
        provider = bubblewrap_sandbox(base_dir=tmp_path)
        network = network_policy_for(define_sandbox_policy(network="deny"))
        handle = await provider.create(CreateInput(network=network))
        try:
            result = await handle.process.exec("cat /proc/net/dev")
            assert result.exit_code == 0, result.stderr
            return [line.split(":")[0].strip() for line in result.stdout.splitlines() if ":" in line]
        finally:
            await handle.destroy()

    assert asyncio.run(main()) == ["lo"]
