"""``_remote.abortable_create`` and ``export_lines``: what the cloud providers share at create and at spawn.

The delete a failed create runs gets the vendor's answer (the providers delete by its id), or None
when the create failed or never answered in time (they fall back to a name or a nonce label).
"""

from __future__ import annotations

import asyncio
import base64

import pytest

from boxwright.abort import AbortController
from boxwright.errors import AbortError
from boxwright.providers._remote import abortable_create, env_line, export_lines


class Vendor:
    """A create call that answers when told to, and the deletes it was asked for."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.deleted: list[str | None] = []

    async def create(self) -> str:
        return await self.answer

    async def delete(self, answer: object) -> None:
        self.deleted.append(answer if answer is None else str(answer))


async def _ready(answer: object) -> str:
    return f"handle of {answer}"


def test_a_create_that_answers_is_the_ready_handle_and_deletes_nothing() -> None:
    async def main() -> None:
        vendor = Vendor()
        vendor.answer.set_result("sb-1")
        assert await abortable_create(vendor.create(), None, _ready, vendor.delete) == "handle of sb-1"
        assert vendor.deleted == []

    asyncio.run(main())


def test_a_failed_ready_deletes_the_sandbox_the_create_answered() -> None:
    async def main() -> None:
        vendor = Vendor()
        vendor.answer.set_result("sb-2")

        async def ready(answer: object) -> str:
            raise RuntimeError("mkdir failed")

        with pytest.raises(RuntimeError, match="mkdir failed"):
            await abortable_create(vendor.create(), None, ready, vendor.delete)
        assert vendor.deleted == ["sb-2"]

    asyncio.run(main())


def test_a_failed_create_deletes_with_no_answer() -> None:
    async def main() -> None:
        vendor = Vendor()
        vendor.answer.set_exception(ConnectionError("reset"))
        with pytest.raises(ConnectionError):
            await abortable_create(vendor.create(), None, _ready, vendor.delete)
        assert vendor.deleted == [None]

    asyncio.run(main())


def test_an_abort_raises_at_once_and_deletes_what_the_late_answer_names() -> None:
    async def main() -> None:
        vendor = Vendor()
        controller = AbortController()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, controller.abort, "stop")
        loop.call_later(0.3, vendor.answer.set_result, "sb-3")
        started = loop.time()
        with pytest.raises(AbortError):
            await abortable_create(vendor.create(), controller.signal, _ready, vendor.delete)
        # The abort is not held until the answer: the cleanup waits for it, then deletes by it.
        assert vendor.deleted == ["sb-3"]
        assert loop.time() - started >= 0.25

    asyncio.run(main())


def test_an_answer_that_never_comes_within_the_bound_deletes_with_none() -> None:
    async def main() -> None:
        vendor = Vendor()
        controller = AbortController()
        asyncio.get_running_loop().call_later(0.05, controller.abort, "stop")
        with pytest.raises(AbortError):
            await abortable_create(vendor.create(), controller.signal, _ready, vendor.delete, answer_within=0.2)
        assert vendor.deleted == [None]

    asyncio.run(main())


def test_export_lines_quote_values_and_refuse_a_key_that_is_script_text() -> None:
    lines = export_lines({"A": "it's $HOME", "B_2": ""})
    assert lines == "export A='it'\"'\"'s $HOME'\nexport B_2=''"
    assert base64.b64decode(env_line({"A": "it's $HOME", "B_2": ""}).strip()).decode() == lines
    with pytest.raises(ValueError, match="not an environment variable name"):
        export_lines({"A; touch /tmp/x": "v"})
