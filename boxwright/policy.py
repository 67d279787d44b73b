"""A portable allow/ask/deny policy, its evaluation, and its mapping onto each harness's permissions.

Command rules are whole-string globs in which ``*`` is the only wildcard and
matches any run of characters, newlines included: a command cannot slip past a
deny rule by putting its payload on a second line. Precedence is deny > ask >
allow > the policy default > ask. Harness CLIs cannot express command globs, so
each native mapping carries over only what the CLI can enforce and skips the
rest; fine-grained decisions go through ``resolve_approval`` (the harness's
permission-prompt hook).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from .errors import InvalidPolicyError
from .sandbox import NetworkPolicy

Decision = Literal["allow", "ask", "deny"]
ApprovalKind = Literal["command", "fileWrite", "network", "tool"]

DECISIONS: tuple[Decision, ...] = ("allow", "ask", "deny")
APPROVAL_REQUESTED_EVENT = "approval-requested"


class CommandRules(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    allow: tuple[str, ...] = ()
    ask: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()


class CapabilityRules(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """Coarse gates for non-command actions; unset falls back to the policy default."""

    file_write: Decision | None = None
    network: Decision | None = None


class SandboxPolicy(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    commands: CommandRules = msgspec.field(default_factory=CommandRules)
    capabilities: CapabilityRules = msgspec.field(default_factory=CapabilityRules)
    default: Decision | None = None


def _decision(field: str, value: object) -> Decision | None:
    if value is None:
        return None
    if value not in DECISIONS:
        raise InvalidPolicyError(field, value, "'allow', 'ask', 'deny' or None")
    return value


def _patterns(field: str, value: Iterable[str]) -> tuple[str, ...]:
    # A bare string would otherwise become one pattern per character.
    if isinstance(value, str):
        raise InvalidPolicyError(field, value, "a list of patterns, not one string")
    patterns = tuple(value)
    for pattern in patterns:
        if not isinstance(pattern, str):
            raise InvalidPolicyError(field, pattern, "a list of strings")
    return patterns


def define_sandbox_policy(
    *,
    default: Decision | None = None,
    allow: Iterable[str] = (),
    ask: Iterable[str] = (),
    deny: Iterable[str] = (),
    file_write: Decision | None = None,
    network: Decision | None = None,
) -> SandboxPolicy:
    return SandboxPolicy(
        commands=CommandRules(allow=_patterns("allow", allow), ask=_patterns("ask", ask), deny=_patterns("deny", deny)),
        capabilities=CapabilityRules(
            file_write=_decision("file_write", file_write), network=_decision("network", network)
        ),
        default=_decision("default", default),
    )


# -- command evaluation ---------------------------------------------------------------------------


def glob_match(pattern: str, text: str) -> bool:
    """Whole-string match where ``*`` matches any run (newlines too) and every other character is literal.

    Literal segments are placed greedily leftmost, which is exact for ``*``-only
    globs and linear in the text, so a long command cannot make matching blow up.
    """
    head, *rest = pattern.split("*")
    if not rest:
        return pattern == text
    tail = rest.pop()
    if len(text) < len(head) + len(tail) or not text.startswith(head) or not text.endswith(tail):
        return False
    pos, end = len(head), len(text) - len(tail)
    for part in rest:
        if part:
            found = text.find(part, pos, end)
            if found == -1:
                return False
            pos = found + len(part)
    return True


def command_forms(command: str, scripts: Mapping[str, str] | None) -> list[str]:
    """The command itself, the script it names, and every script name whose command it is."""
    trimmed = command.strip()
    forms = [trimmed]
    if scripts:
        expanded = scripts.get(trimmed)
        if expanded is not None:
            forms.append(expanded.strip())
        forms += [name for name, value in scripts.items() if value.strip() == trimmed]
    return list(dict.fromkeys(forms))


def _matches(patterns: Iterable[str], command: str, scripts: Mapping[str, str] | None) -> bool:
    forms = command_forms(command, scripts)
    return any(
        glob_match(pattern_form, form)
        for pattern in patterns
        for pattern_form in command_forms(pattern, scripts)
        for form in forms
    )


def evaluate_command(cmd: str, policy: SandboxPolicy | None, scripts: Mapping[str, str] | None = None) -> Decision:
    fallback: Decision = (policy.default if policy is not None else None) or "ask"
    if policy is None:
        return fallback
    rules = policy.commands
    if _matches(rules.deny, cmd, scripts):
        return "deny"
    if _matches(rules.ask, cmd, scripts):
        return "ask"
    if _matches(rules.allow, cmd, scripts):
        return "allow"
    return fallback


# -- approvals ------------------------------------------------------------------------------------


class ApprovalResolution(msgspec.Struct, frozen=True, rename="camel"):
    """A final decision; ``needs_approval`` marks an ``ask`` the client has not answered (denied for now)."""

    decision: Literal["allow", "deny"]
    needs_approval: bool
    approval_id: str


def approval_id(provider: str, kind: ApprovalKind, target: str) -> str:
    return f"{provider}:{kind}:{target}"


def resolve_approval(
    policy: SandboxPolicy | None,
    *,
    provider: str,
    kind: ApprovalKind,
    target: str,
    approvals: Mapping[str, bool] | None = None,
    scripts: Mapping[str, str] | None = None,
) -> ApprovalResolution:
    """Decide one harness action: ``target`` is the command for ``kind="command"``, else the tool name."""
    key = approval_id(provider, kind, target)
    default = policy.default if policy is not None else None
    base: Decision
    if kind == "command":
        base = evaluate_command(target, policy, scripts)
    elif kind == "fileWrite":
        base = (policy.capabilities.file_write if policy is not None else None) or default or "ask"
    elif kind == "network":
        base = (policy.capabilities.network if policy is not None else None) or default or "ask"
    else:
        base = default or "ask"
    if base != "ask":
        return ApprovalResolution(base, False, key)
    granted = (approvals or {}).get(key)
    if granted is None:
        return ApprovalResolution("deny", True, key)
    return ApprovalResolution("allow" if granted else "deny", False, key)


def approval_requested_value(approval_id: str, title: str, detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The value of the CUSTOM ``approval-requested`` event: ``{approvalId, title, ...detail}``."""
    return {"approvalId": approval_id, "title": title, **(detail or {})}


# -- native mappings ------------------------------------------------------------------------------


class ClaudePermissions(msgspec.Struct):
    permission_mode: str | None
    allowed_tools: list[str]
    disallowed_tools: list[str]


class CodexPermissions(msgspec.Struct):
    sandbox: str | None
    network_access: bool | None
    approval: str | None


class GrokPermissions(msgspec.Struct):
    read_only: bool
    web_search: bool
    auto_approve: bool


CLAUDE_WRITE_TOOLS = ("Write", "Edit", "MultiEdit")
CLAUDE_NETWORK_TOOLS = ("WebFetch", "WebSearch")
CLAUDE_BUILTIN_TOOLS = frozenset(
    ("Bash", "Read", "Write", "Edit", "MultiEdit", "Glob", "Grep", "WebFetch", "WebSearch", "NotebookEdit", "Task")
)
_CLAUDE_MODES: dict[Decision, str] = {"allow": "bypassPermissions", "ask": "acceptEdits", "deny": "default"}


def claude_code_permissions(policy: SandboxPolicy | None) -> ClaudePermissions:
    if policy is None:
        return ClaudePermissions(None, [], [])
    disallowed: list[str] = []
    if policy.capabilities.file_write == "deny":
        disallowed += CLAUDE_WRITE_TOOLS
    if policy.capabilities.network == "deny":
        disallowed += CLAUDE_NETWORK_TOOLS
    # Only rules naming a whole built-in tool are expressible; command globs stay with the approval hook.
    disallowed += [p for p in policy.commands.deny if p in CLAUDE_BUILTIN_TOOLS]
    allowed = [p for p in policy.commands.allow if p in CLAUDE_BUILTIN_TOOLS]
    mode = _CLAUDE_MODES[policy.default] if policy.default is not None else None
    return ClaudePermissions(mode, list(dict.fromkeys(allowed)), list(dict.fromkeys(disallowed)))


def _has_ask_rule(policy: SandboxPolicy) -> bool:
    caps = policy.capabilities
    return bool(policy.commands.ask) or "ask" in (caps.file_write, caps.network)


def codex_permissions(policy: SandboxPolicy | None) -> CodexPermissions:
    if policy is None:
        return CodexPermissions(None, None, None)
    network = policy.capabilities.network
    approval: str | None = None
    # A deny list alone leaves approval alone: it is a hard block, not a question for a human.
    if _has_ask_rule(policy) or policy.default == "ask":
        approval = "on-request"
    elif policy.default == "deny":
        approval = "untrusted"
    elif policy.default == "allow":
        approval = "never"
    return CodexPermissions(
        "read-only" if policy.capabilities.file_write == "deny" else None,
        {"allow": True, "deny": False}.get(network) if network is not None else None,
        approval,
    )


def grok_permissions(policy: SandboxPolicy | None) -> GrokPermissions:
    if policy is None:
        return GrokPermissions(read_only=False, web_search=True, auto_approve=True)
    # Headless grok cancels every tool that is not auto-approved, so only a real ask/deny default
    # or an ask rule turns auto-approve off; a deny list alone must not.
    conservative = _has_ask_rule(policy) or policy.default in ("ask", "deny")
    return GrokPermissions(
        read_only=policy.capabilities.file_write == "deny",
        web_search=policy.capabilities.network != "deny",
        auto_approve=not conservative,
    )


def network_policy_for(policy: SandboxPolicy | None) -> NetworkPolicy | None:
    """What provider create must enforce; a provider that cannot deny egress refuses the create."""
    if policy is not None and policy.capabilities.network == "deny":
        return NetworkPolicy(mode="deny")
    return None
