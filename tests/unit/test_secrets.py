"""Secrets (R5-R8): values never leak through the object, resolve by name, and are masked in logs."""

import copy
import gc
import io
import json
import logging
import pickle
import sys
import uuid
import weakref

import msgspec
import pytest

from boxwright.errors import SecretResolutionError
from boxwright.secrets import (
    BearerRef,
    SecretRedactingFilter,
    SecretRef,
    Secrets,
    bearer,
    create_secrets,
    install_secret_redaction,
    is_bearer_ref,
    is_secret_ref,
    redact,
    register_secret_values,
    resolve_all_secrets,
    resolve_bearer,
    resolve_secret,
    resolve_value,
)


def unique(prefix: str) -> str:
    # The redaction registry is process-wide: a short value such as "tok" would mask "token" in
    # every later test's logs, so each test uses values nothing else contains.
    return f"{prefix}-{uuid.uuid4().hex}"


def test_a13_no_view_of_a_secrets_object_shows_a_value():
    gh, other = unique("gh"), unique("other")
    secrets = create_secrets({"GITHUB_TOKEN": gh}, OTHER=other)
    views = [
        repr(secrets),
        str(secrets),
        f"{secrets}",
        repr(secrets.keys()),
        repr(list(secrets)),
        repr(vars(secrets)),
        repr(dir(secrets)),
        repr(secrets.GITHUB_TOKEN),
        repr(secrets["OTHER"]),
        json.dumps(vars(secrets), default=list),
        json.dumps(secrets, default=str),
        msgspec.json.encode(secrets.GITHUB_TOKEN).decode(),
        msgspec.json.encode(bearer(secrets.OTHER)).decode(),
    ]
    for view in views:
        assert gh not in view and other not in view, view
    assert secrets.keys() == ["GITHUB_TOKEN", "OTHER"] == list(secrets)
    assert len(secrets) == 2 and "OTHER" in secrets and "other" not in secrets
    assert secrets.GITHUB_TOKEN == SecretRef("GITHUB_TOKEN")
    assert msgspec.json.encode(secrets.GITHUB_TOKEN) == b'{"secretName":"GITHUB_TOKEN"}'


def test_a13_encoding_and_pickling_a_secrets_object_raise():
    secrets = create_secrets(TOKEN=unique("v"))
    for attempt in (
        lambda: msgspec.json.encode(secrets),
        lambda: msgspec.json.encode({"secrets": secrets}),
        lambda: msgspec.msgpack.encode(secrets),
        lambda: msgspec.to_builtins(secrets),
        lambda: json.dumps(secrets),
        lambda: json.dumps([secrets]),
        lambda: pickle.dumps(secrets),
        lambda: pickle.dumps({"nested": [secrets]}, protocol=pickle.HIGHEST_PROTOCOL),
    ):
        with pytest.raises(TypeError):
            attempt()
    # A reference holds no value, so it pickles; copies of Secrets are the object itself.
    assert pickle.loads(pickle.dumps(bearer(secrets.TOKEN))) == BearerRef(SecretRef("TOKEN"))
    assert copy.deepcopy({"s": secrets})["s"] is secrets and copy.copy(secrets) is secrets


def test_secrets_is_immutable_and_unknown_names_fail_by_name():
    secrets = create_secrets(A=unique("a"))
    with pytest.raises(AttributeError):
        secrets.A = SecretRef("B")  # type: ignore[misc]
    with pytest.raises(AttributeError, match="'MISSING'"):
        _ = secrets.MISSING
    with pytest.raises(KeyError, match="'MISSING'"):
        _ = secrets["MISSING"]
    with pytest.raises(TypeError, match="'N'") as err:
        create_secrets(N=12345)  # type: ignore[arg-type]
    assert "12345" not in str(err.value)
    keyword_wins = create_secrets({"A": "from-mapping"}, A=unique("kw"))
    assert resolve_secret(keyword_wins, keyword_wins.A) != "from-mapping"


def test_a14_resolution_errors_and_bearer():
    token = unique("tok")
    secrets = create_secrets(GH=token)
    assert resolve_secret(secrets, secrets.GH) == token
    assert resolve_bearer(secrets, bearer(secrets.GH)) == f"Bearer {token}"
    assert resolve_bearer(secrets, secrets.GH) == f"Bearer {token}"
    assert resolve_value(secrets, "plain") == "plain"
    assert resolve_value(secrets, secrets.GH) == token
    assert resolve_value(secrets, bearer(secrets.GH)) == f"Bearer {token}"

    with pytest.raises(SecretResolutionError, match="unknown secret 'NOPE'") as err:
        resolve_secret(secrets, SecretRef("NOPE"))
    assert err.value.secret_name == "NOPE" and token not in str(err.value)
    with pytest.raises(SecretResolutionError, match="not created by create_secrets"):
        resolve_secret({"GH": token}, secrets.GH)  # type: ignore[arg-type]
    with pytest.raises(SecretResolutionError, match="no secrets"):
        resolve_secret(None, secrets.GH)
    with pytest.raises(SecretResolutionError, match="expected a SecretRef"):
        resolve_secret(secrets, "GH")
    with pytest.raises(TypeError):
        bearer("GH")  # type: ignore[arg-type]


def test_refs_are_structural_and_any_secrets_resolves_by_name():
    class Foreign:
        secret_name = "GH"

    assert is_secret_ref(Foreign()) and is_secret_ref(SecretRef("x"))
    assert not is_secret_ref({"secret_name": "GH"}) and not is_secret_ref(SecretRef(1))  # type: ignore[arg-type]
    assert is_bearer_ref(bearer(Foreign())) and not is_bearer_ref(SecretRef("x"))  # type: ignore[arg-type]
    rotated = unique("rotated")
    # Rotation: the same reference resolves against whichever Secrets the next run carries.
    assert resolve_secret(create_secrets(GH=rotated), Foreign()) == rotated


def test_resolve_all_secrets_returns_a_fresh_dict():
    a, b = unique("a"), unique("b")
    secrets = create_secrets(A=a, B=b)
    first = resolve_all_secrets(secrets)
    assert first == {"A": a, "B": b}
    first["A"] = "changed"
    del first["B"]
    assert resolve_all_secrets(secrets) == {"A": a, "B": b}
    assert resolve_all_secrets(None) == {}
    with pytest.raises(SecretResolutionError, match="not created by create_secrets"):
        resolve_all_secrets(object())  # type: ignore[arg-type]
    assert resolve_all_secrets(create_secrets()) == {} and not create_secrets()


@pytest.fixture
def captured():
    """Every record of the process, formatted by a real handler on the root logger."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s %(detail)s", defaults={"detail": ""}))
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(old_level)


def test_r8_resolved_values_are_masked_on_boxwright_loggers(captured):
    token = unique("ghp")
    secrets = create_secrets(GH=token)
    existing = logging.getLogger(f"boxwright.early.{uuid.uuid4().hex}")
    resolve_secret(secrets, secrets.GH)
    assert any(isinstance(f, SecretRedactingFilter) for f in logging.getLogger("boxwright").filters)
    assert any(isinstance(f, SecretRedactingFilter) for f in existing.filters)

    top = logging.getLogger("boxwright")
    # Created after the value was resolved: covered by the record factory (filters are not inherited).
    late = logging.getLogger(f"boxwright.late.{uuid.uuid4().hex}")
    top.info("cloning with %s", token, extra={"detail": f"header=Bearer {token}"})
    existing.info("extra only", extra={"detail": f"token={token}"})
    late.warning("args %r", {"headers": {"Authorization": f"Bearer {token}"}})
    for logger in (existing, late):
        try:
            try:
                raise ValueError(f"git said: bad credentials {token}")
            except ValueError as inner:
                raise RuntimeError(f"clone failed ({token})") from inner
        except RuntimeError:
            logger.exception("setup failed for %s", "repo")
    late.info("stack", stack_info=True)
    text = captured.getvalue()
    assert token not in text
    assert "cloning with ***" in text and "header=Bearer ***" in text and "token=***" in text
    assert "'Authorization': 'Bearer ***'" in text
    assert text.count("RuntimeError: clone failed (***)") == 2
    assert text.count("ValueError: git said: bad credentials ***") == 2
    assert text.count("setup failed for repo") == 2


def test_filter_leaves_clean_records_untouched_and_install_is_idempotent():
    token = unique("clean")
    register_secret_values([token])
    install_secret_redaction()
    install_secret_redaction()
    assert sum(isinstance(f, SecretRedactingFilter) for f in logging.getLogger("boxwright").filters) == 1
    try:
        raise KeyError("no secret here")
    except KeyError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("boxwright", logging.INFO, __file__, 1, "n=%d", (3,), exc_info)
    assert SecretRedactingFilter().filter(record)
    assert record.args == (3,) and record.exc_info is exc_info


def test_redact_masks_every_occurrence_and_merges_overlaps():
    a = unique("over")
    b = a[-6:] + "tail-" + uuid.uuid4().hex  # starts with the end of a
    register_secret_values([a, b, ""])
    assert redact(f"x{a}y{a}") == "x***y***"
    assert redact(f"<{a[:-6]}{b}>") == "<***>"  # the union of both spans, nothing left between
    assert redact(f"{a}{b}") == "***"  # adjacent occurrences join: no fragment survives
    assert redact("nothing to see") == "nothing to see" and redact("") == ""
    assert redact(f"before {a[:-1]} after") == f"before {a[:-1]} after"  # a prefix is not the value


def test_secrets_object_is_collectable():
    secrets = create_secrets(X=unique("gc"))
    ref = weakref.ref(secrets)
    assert isinstance(ref(), Secrets)
    del secrets
    gc.collect()
    assert ref() is None
