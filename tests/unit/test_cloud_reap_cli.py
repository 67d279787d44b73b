"""``boxwright reap --provider``: an unknown name is a usage error naming the choices; a provider that
cannot list its sandboxes says why and how to find them, and exits 1 (never a silent "nothing to reap")."""

from __future__ import annotations

import pytest

from boxwright.cli import main


def test_an_unknown_provider_is_a_usage_error_naming_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["reap", "--provider", "nosuch"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "unknown provider 'nosuch'" in err and "e2b" in err and "upstash-box" in err, err


def test_docker_and_a_cloud_provider_in_one_call_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["reap", "--provider", "docker", "--provider", "e2b"])
    assert caught.value.code == 2 and "two calls" in capsys.readouterr().err


def test_a_provider_that_cannot_list_its_sandboxes_says_how_to_find_them(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("BOXWRIGHT_CLOUDFLARE_URL", raising=False)
    assert main(["reap", "--provider", "cloudflare", "--provider", "sbx", "--yes"]) == 1
    out = capsys.readouterr()
    assert "cloudflare: cannot reap:" in out.err and "ids start with `bw-`" in out.err, out.err
    assert "sbx: cannot reap:" in out.err and "sbx ls" in out.err, out.err
    assert "no boxwright sandbox" not in out.out
