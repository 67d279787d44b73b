"""BOXWRIGHT_DOCKER_LABELS: the labels a deployment (or a CI session) adds to every container and image."""

from __future__ import annotations

import pytest

from boxwright.providers.docker import LABELS_ENV, DockerProvider, env_labels


def test_the_env_labels_parse_and_the_provider_puts_them_under_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LABELS_ENV, " team=infra, ci ,,boxwright.managed=0,x=a=b")
    assert env_labels() == {"team": "infra", "ci": "1", "boxwright.managed": "0", "x": "a=b"}
    labels = DockerProvider("img", labels={"team": "app"}, lease_seconds=60)._labels("k" * 16, "r-1")
    # The provider's own labels win: an environment cannot unmark what the reaper looks for.
    assert labels["team"] == "app" and labels["ci"] == "1" and labels["boxwright.managed"] == "1", labels
    assert labels["boxwright.sandbox"] == "k" * 16 and labels["boxwright.run"] == "r-1", labels
    monkeypatch.delenv(LABELS_ENV)
    assert env_labels() == {}
