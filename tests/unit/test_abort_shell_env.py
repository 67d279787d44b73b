import asyncio
import subprocess

import pytest

from boxwright.abort import AbortController, AbortSignal
from boxwright.errors import AbortError
from boxwright.providers._posix import exit_code_of, merged_env
from boxwright.shell import join, positional, quote


def test_abort_runs_listeners_once_with_the_reason():
    controller = AbortController()
    seen: list[object] = []
    remove = controller.signal.add_listener(seen.append)
    controller.abort("boxwright:cancel-requested")
    controller.abort("second")
    assert seen == ["boxwright:cancel-requested"]
    assert controller.signal.reason == "boxwright:cancel-requested"
    remove()
    with pytest.raises(AbortError, match="cancel-requested"):
        controller.signal.throw_if_aborted()
    late: list[object] = []
    controller.signal.add_listener(late.append)
    assert late == ["boxwright:cancel-requested"]


def test_abort_any_and_timeout_and_wait():
    async def main() -> None:
        a, b = AbortController(), AbortController()
        either = AbortSignal.any([a.signal, None, b.signal])
        b.abort("b")
        assert either.aborted and either.reason == "b"
        t = AbortSignal.timeout(0.01)
        reason = await asyncio.wait_for(t.wait(), 2)
        assert isinstance(reason, TimeoutError)

    asyncio.run(main())


@pytest.mark.parametrize("value", ["plain", "it's", "$(rm -rf /)", "a b\nc", "`x`", "", "-rf", "€"])
def test_quote_round_trips_through_a_real_shell(value):
    out = subprocess.run(["sh", "-c", f"printf %s {quote(value)}"], capture_output=True, check=True)
    assert out.stdout.decode() == value
    assert join([value, value]).count(quote(value)) == 2


def test_quote_refuses_nul_and_positional_refuses_options():
    with pytest.raises(ValueError, match="NUL"):
        quote("a\x00b")
    with pytest.raises(ValueError, match="git ref must not start with '-'"):
        positional("--upload-pack=evil", "git ref")


def test_scrub_env_deletes_keys_and_wins_over_explicit_values():
    env = merged_env(
        {"A": "host", "XAI_API_KEY": "k"}, {"B": "handle"}, {"XAI_API_KEY": "cmd", "C": "c"}, ["XAI_API_KEY", "ABSENT"]
    )
    assert env == {"A": "host", "B": "handle", "C": "c"}
    assert merged_env({"A": "1"}, {"A": "2"}, {"A": "3"}, []) == {"A": "3"}


def test_signal_deaths_report_128_plus_signal():
    assert exit_code_of(-15) == 143
    assert exit_code_of(-9) == 137
    assert exit_code_of(0) == 0
    assert exit_code_of(7) == 7
