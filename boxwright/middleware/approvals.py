"""A person answers the policy's ``ask`` while the run waits: the service's approval desk and its tool.

The policy decides each action an agent wants (``boxwright.policy.resolve_approval``): ``allow``
and ``deny`` need nobody, ``ask`` needs a person. ``ask_person_tool`` is a host tool the agent
calls over the bridge before such an action: an ``ask`` is announced on the run's stream as a
CUSTOM ``approval-requested`` event (``{approvalId, title, ..., live: true}``) and the call waits
on the service's ``ApprovalDesk`` until ``POST /runs/{id}/approval`` answers it (or the run is
cancelled, or ``APPROVAL_TIMEOUT_S`` passes: no answer is a deny), then a CUSTOM
``approval-resolved`` event (``{approvalId, decision}``) records the answer in the run's log, so
a page that reloads knows the question was settled.

The desk is in-process, like the run's abort band: the answer must reach the replica that drives
the run (the one whose bridge holds the agent's call).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from boxwright.policy import (
    APPROVAL_REQUESTED_EVENT,
    ApprovalKind,
    SandboxPolicy,
    approval_requested_value,
    resolve_approval,
)
from boxwright.tool_bridge.tools import Tool, ToolContext, define_tool

APPROVAL_RESOLVED_EVENT: Final = "approval-resolved"
# Long enough for a person to read the question; a run nobody watches must not hold its sandbox forever.
APPROVAL_TIMEOUT_S: Final = 600.0
ASK_PERSON_TOOL: Final = "ask_person"
Decision = Literal["allow", "deny"]


class ApprovalAnswer(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True):
    """The body of ``POST /runs/{id}/approval``."""

    approval_id: str
    decision: Decision


@dataclass
class _Question:
    answer: asyncio.Future[bool]
    waiters: int = 0


@dataclass
class ApprovalDesk:
    """The questions runs driven here are waiting on, by ``(run id, approval id)``."""

    _waiting: dict[tuple[str, str], _Question] = field(default_factory=dict)

    def pending(self, run_id: str) -> list[str]:
        """The approval ids ``run_id`` waits on now."""
        return [approval for (run, approval) in self._waiting if run == run_id]

    async def ask(self, run_id: str, approval_id: str, *, timeout_s: float = APPROVAL_TIMEOUT_S) -> bool | None:
        """Wait for a person's answer; ``None`` when none came in ``timeout_s``. Cancelled with the caller."""
        key = (run_id, approval_id)
        question = self._waiting.get(key)
        if question is None:
            question = self._waiting[key] = _Question(asyncio.get_running_loop().create_future())
        question.waiters += 1
        try:
            async with asyncio.timeout(timeout_s):
                # Shielded: two calls asking the same question share one answer; one leaving ends neither.
                return await asyncio.shield(question.answer)
        except TimeoutError:
            return None
        finally:
            question.waiters -= 1
            if question.waiters == 0 and self._waiting.get(key) is question:
                del self._waiting[key]

    def answer(self, run_id: str, approval_id: str, allow: bool) -> bool:
        """Settle the question; False when ``run_id`` is not waiting on ``approval_id`` (here)."""
        question = self._waiting.get((run_id, approval_id))
        if question is None or question.answer.done():
            return False
        question.answer.set_result(allow)
        return True


_ASK_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "kind": {"type": "string", "enum": ["command", "fileWrite", "network", "tool"]},
        "target": {"type": "string", "description": "the command, or the tool's name"},
        "reason": {"type": "string", "description": "why the agent wants it, shown to the person"},
    },
    "required": ["kind", "target"],
    "additionalProperties": False,
}
_KINDS: Final = ("command", "fileWrite", "network", "tool")


def ask_person_tool(
    desk: ApprovalDesk, policy: SandboxPolicy | None, *, provider: str = "agent", timeout_s: float = APPROVAL_TIMEOUT_S
) -> Tool:
    """A host tool answering ``{kind, target, reason?}`` with ``{"decision": "allow" | "deny", "by"}``.

    ``by`` is ``policy`` when the policy decided alone, ``person`` when someone answered, and
    ``timeout`` when nobody did in time (a deny).
    """

    async def decide(args: dict[str, Any], ctx: ToolContext) -> dict[str, str]:
        kind = args.get("kind")
        target = args.get("target")
        if kind not in _KINDS or not isinstance(target, str) or not target:
            raise ValueError(f"{ASK_PERSON_TOOL} takes kind (one of {', '.join(_KINDS)}) and a non-empty target")
        action: ApprovalKind = kind
        verdict = resolve_approval(policy, provider=provider, kind=action, target=target)
        if not verdict.needs_approval:
            return {"decision": verdict.decision, "by": "policy"}
        run_id = ctx.run_id or ""
        reason = args.get("reason")
        title = f"Allow {kind} {target!r}?" + (f" ({reason})" if isinstance(reason, str) and reason else "")
        detail = {"provider": provider, "kind": kind, "target": target, "live": True}
        ctx.emit_custom_event(APPROVAL_REQUESTED_EVENT, approval_requested_value(verdict.approval_id, title, detail))
        allowed = await desk.ask(run_id, verdict.approval_id, timeout_s=timeout_s)
        decision: Decision = "allow" if allowed else "deny"
        by = "timeout" if allowed is None else "person"
        ctx.emit_custom_event(
            APPROVAL_RESOLVED_EVENT, {"approvalId": verdict.approval_id, "decision": decision, "by": by}
        )
        return {"decision": decision, "by": by}

    return define_tool(
        ASK_PERSON_TOOL,
        "Ask before an action the sandbox policy may not allow: answers allow or deny (a person may decide).",
        _ASK_SCHEMA,
        decide,
        read_only=True,
    )


__all__ = [
    "APPROVAL_RESOLVED_EVENT",
    "APPROVAL_TIMEOUT_S",
    "ASK_PERSON_TOOL",
    "ApprovalAnswer",
    "ApprovalDesk",
    "ask_person_tool",
]
