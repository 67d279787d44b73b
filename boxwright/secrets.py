"""Secrets: named references that resolve to values only at use time, and redaction of those values.

``create_secrets({...})`` returns a ``Secrets`` whose entries are ``SecretRef``
tokens carrying only a name. The values live in a module-private registry keyed
by the ``Secrets`` object (the counterpart of the original's non-enumerable
symbol), so no attribute, iteration, repr, encoding or pickle of the object can
reach them. Resolving a value registers it for redaction: from then on the
``boxwright`` loggers print it as ``***``, and ``redact`` masks it in any other
text (error messages, event payloads).
"""

from __future__ import annotations

import hashlib as _hashlib
import hmac as _hmac
import logging
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from secrets import token_urlsafe as _token_urlsafe
from typing import Any, NoReturn, TypeGuard

import msgspec

from .errors import SecretResolutionError

MASK = "***"
# Every per-run token boxwright mints starts with this. The streaming scrubber holds back a delta's
# end while it could still become a secret, so which ends it holds depends on the secrets' first
# characters. A host that takes a run over mints tokens of its own and re-translates the journal:
# with random first characters it would cut the replayed text elsewhere than its predecessor
# stored it, and the takeover's alignment would call that a divergence. With one fixed prefix,
# every host holds back the same ends (short of text that spells out a token itself).
TOKEN_PREFIX = "bwt_"


class SecretRef(msgspec.Struct, frozen=True, rename="camel"):
    """A reference to a named secret. It holds the name only, so encoding or pickling it is harmless."""

    secret_name: str


class BearerRef(msgspec.Struct, frozen=True):
    """A header value that resolves to ``"Bearer <value of ref>"``."""

    ref: SecretRef


class Secrets:
    """Named secret references; ``secrets.NAME`` or ``secrets["NAME"]`` gives a ``SecretRef``.

    A secret whose name collides with a method (``keys``) or starts with ``_`` is
    reached with ``secrets["name"]``.
    """

    _names: tuple[str, ...]

    def __init__(self, values: Mapping[str, str]) -> None:
        object.__setattr__(self, "_names", tuple(values))
        _REGISTRY[self] = dict(values)

    def __getitem__(self, name: str) -> SecretRef:
        if name not in self._names:
            raise KeyError(f"no secret named {name!r}; known: {list(self._names)}")
        return SecretRef(name)

    def __getattr__(self, name: str) -> SecretRef:
        # Only reached when normal lookup fails; private and dunder names must fail as usual
        # so copy, pickle and introspection probes behave.
        if name.startswith("_") or name not in self._names:
            raise AttributeError(f"no secret named {name!r}; known: {list(self._names)}")
        return SecretRef(name)

    def keys(self) -> list[str]:
        return list(self._names)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def __repr__(self) -> str:
        return f"Secrets({list(self._names)})"

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError("Secrets is immutable; create a new one with create_secrets(...)")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError("Secrets is immutable")

    def __copy__(self) -> Secrets:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> Secrets:
        return self

    def __reduce_ex__(self, protocol: Any) -> NoReturn:
        raise TypeError("Secrets cannot be pickled: its values must never be written anywhere")

    def __reduce__(self) -> NoReturn:
        raise TypeError("Secrets cannot be pickled: its values must never be written anywhere")


# Weak keys: a Secrets nobody holds any more takes its values with it.
_REGISTRY: weakref.WeakKeyDictionary[Secrets, dict[str, str]] = weakref.WeakKeyDictionary()


def mint_token(nbytes: int = 32) -> str:
    """A fresh per-run bearer token (``TOKEN_PREFIX`` + URL-safe random): see ``TOKEN_PREFIX`` for why the prefix."""
    return TOKEN_PREFIX + _token_urlsafe(nbytes)


def run_bridge_token(secret: str | None, run_id: str, thread_id: str) -> str:
    """The bearer token of run ``run_id``'s tool bridge: derived under ``secret`` when one is shared, else minted.

    Why derived: the agent's MCP config (the bridge URL and this token) is written once, when the agent
    starts, and no CLI re-reads it, so a replica that takes the run over must serve the run's tools under
    the very token its predecessor handed out. An HMAC-SHA256 of the run and thread ids under the secret
    the replicas share (``runner_secret`` / ``$BOXWRIGHT_RUNNER_SECRET``, the shape of
    ``colocated.runner_token``) is that token on every replica, and nothing secret is stored; it differs
    per run, so an agent that learns its own token learns no other run's. ``TOKEN_PREFIX`` too: every
    host's scrubber holds back the same delta ends (see ``TOKEN_PREFIX``). Without a secret (a single
    host, which no successor needs to match): ``mint_token()``.
    """
    if not secret:
        return mint_token()
    message = f"boxwright bridge token v1\0{run_id}\0{thread_id}".encode()
    return TOKEN_PREFIX + _hmac.new(secret.encode(), message, _hashlib.sha256).hexdigest()


def create_secrets(values: Mapping[str, str] | None = None, /, **kw: str) -> Secrets:
    """Secrets from a mapping and/or keywords (a keyword wins over the same name in the mapping)."""
    merged = {**(values or {}), **kw}
    for name, value in merged.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"secret names must be non-empty strings, got {name!r}")
        if not isinstance(value, str):
            # The type only: a wrongly typed value may still be sensitive.
            raise TypeError(f"secret {name!r} must be a str, got {type(value).__name__}")
    return Secrets(merged)


def bearer(ref: SecretRef) -> BearerRef:
    if not is_secret_ref(ref):
        raise TypeError(f"bearer() takes a SecretRef, got {type(ref).__name__}")
    return BearerRef(ref if isinstance(ref, SecretRef) else SecretRef(ref.secret_name))


def is_secret_ref(x: object) -> TypeGuard[SecretRef]:
    """Any object carrying a string ``secret_name`` counts, as in the original's structural check."""
    return isinstance(getattr(x, "secret_name", None), str)


def is_bearer_ref(x: object) -> TypeGuard[BearerRef]:
    return is_secret_ref(getattr(x, "ref", None))


def _values_of(secrets: object, caller: str) -> dict[str, str]:
    if secrets is None:
        raise SecretResolutionError(
            f"{caller}: no secrets were given; pass secrets=create_secrets(...) to define_workspace"
        )
    values = _REGISTRY.get(secrets) if isinstance(secrets, Secrets) else None
    if values is None:
        raise SecretResolutionError(f"{caller}: secrets object was not created by create_secrets")
    return values


def resolve_secret(secrets: Secrets | None, ref: object) -> str:
    values = _values_of(secrets, "resolve_secret")
    if not is_secret_ref(ref):
        raise SecretResolutionError(f"resolve_secret: expected a SecretRef, got {type(ref).__name__}")
    name = ref.secret_name
    if name not in values:
        raise SecretResolutionError(f"resolve_secret: unknown secret {name!r}; known: {list(values)}", name)
    value = values[name]
    _remember((value,))
    return value


def resolve_bearer(secrets: Secrets | None, ref: BearerRef | SecretRef) -> str:
    inner = ref.ref if is_bearer_ref(ref) else ref
    return f"Bearer {resolve_secret(secrets, inner)}"


def resolve_value(secrets: Secrets | None, value: str | SecretRef | BearerRef) -> str:
    """A header-style value: plain strings pass through, references resolve."""
    if isinstance(value, str):
        return value
    if is_bearer_ref(value):
        return resolve_bearer(secrets, value)
    return resolve_secret(secrets, value)


def resolve_all_secrets(secrets: Secrets | None) -> dict[str, str]:
    """Every name and value, in a fresh dict the caller may mutate; no secrets -> ``{}``."""
    if secrets is None:
        return {}
    resolved = dict(_values_of(secrets, "resolve_all_secrets"))
    _remember(resolved.values())
    return resolved


# -- redaction ------------------------------------------------------------------------------------

_values_lock = threading.Lock()
# Values registered for the life of the process: an app's configured secrets (bounded by its config).
_process_values: frozenset[str] = frozenset()
# Rebound, never mutated, so readers on any thread see a consistent set without the lock: the
# process-wide values plus those of every open ``SecretScope``.
_redacted: frozenset[str] = frozenset()
_open_scopes: dict[int, SecretScope] = {}


def _recompute() -> None:
    global _redacted
    union: set[str] = set(_process_values)
    for scope in _open_scopes.values():
        union |= scope.values
    _redacted = frozenset(union)


def process_secret_values() -> frozenset[str]:
    """The values ``register_secret_values`` registered (an app's configured secrets), for a run's event scrubber."""
    return _process_values


def register_secret_values(values: Iterable[str]) -> None:
    """Mask these values from now on, for the life of the process. Empty strings are ignored: they occur everywhere.

    For values that belong to one run (its bridge token, a minted credential) use that run's
    ``SecretScope``: process-wide values only ever grow, and every log record pays for each one.
    """
    global _process_values
    new = {v for v in values if isinstance(v, str) and v}
    if new <= _process_values:
        return
    with _values_lock:
        _process_values = _process_values | new
        _recompute()


def restore_process_secret_values(values: frozenset[str]) -> None:
    """Puts back the process-wide set ``process_secret_values()`` returned earlier (for test isolation).

    A service never needs it: its configured secrets stay masked for its life. A test process that builds
    many services would otherwise mask every earlier one's tokens in every later test.
    """
    global _process_values
    if values == _process_values:
        return
    with _values_lock:
        _process_values = values
        _recompute()


class SecretScope:
    """The secret values of one run: masked by ``redact`` and in logs while the scope is open.

    ``with SecretScope() as scope: scope.add(...)``. On exit the values are released (unless
    another open scope or the process-wide set holds them too), so a long-lived service that runs
    many agents does not mask, and pay for, every token it ever minted.
    """

    def __init__(self, values: Iterable[str] = ()) -> None:
        self._values: frozenset[str] = frozenset(v for v in values if isinstance(v, str) and v)

    @property
    def values(self) -> frozenset[str]:
        return self._values

    def add(self, values: Iterable[str]) -> None:
        new = frozenset(v for v in values if isinstance(v, str) and v)
        if new <= self._values:
            return
        with _values_lock:
            self._values = self._values | new
            if id(self) in _open_scopes:
                _recompute()

    def redact(self, text: str) -> str:
        """``text`` with this scope's values (and every other registered one) masked."""
        return redact(text)

    def __enter__(self) -> SecretScope:
        with _values_lock:
            _open_scopes[id(self)] = self
            _recompute()
        install_secret_redaction()
        return self

    def __exit__(self, *exc: object) -> None:
        with _values_lock:
            _open_scopes.pop(id(self), None)
            _recompute()


def _remember(values: Iterable[str]) -> None:
    register_secret_values(values)
    install_secret_redaction()


def redact(text: str) -> str:
    """``text`` with every occurrence of every registered value replaced by ``***``.

    Overlapping or adjacent occurrences of different values merge into one mask,
    so no fragment of either survives between two masks.
    """
    values = _redacted
    if not values or not text:
        return text
    spans: list[tuple[int, int]] = []
    for value in values:
        start = text.find(value)
        while start != -1:
            spans.append((start, start + len(value)))
            start = text.find(value, start + 1)
    if not spans:
        return text
    spans.sort()
    parts: list[str] = []
    cursor = 0
    span_start, span_end = spans[0]
    for start, end in spans[1:]:
        if start <= span_end:
            span_end = max(span_end, end)
            continue
        parts += (text[cursor:span_start], MASK)
        cursor = span_end
        span_start, span_end = start, end
    parts += (text[cursor:span_start], MASK, text[span_end:])
    return "".join(parts)


# Attributes every LogRecord has; anything else on a record came from ``extra=`` and may hold a value.
_STANDARD_RECORD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class SecretRedactingFilter(logging.Filter):
    """Masks registered secret values in a record's message, args, extras, traceback and stack text.

    A record is rewritten only when it contains a value; then its message is
    pre-formatted (args folded in) and a traceback that held a value is kept as
    redacted ``exc_text`` with ``exc_info`` dropped, so no handler can format the
    raw exception again.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not _redacted:
            return True
        try:
            message = record.getMessage()
        except Exception:
            # Logging would print msg and args raw to stderr on a formatting error; fold them first.
            message = f"{record.msg!s} {record.args!r}"
        masked = redact(message)
        if masked != message:
            record.msg, record.args = masked, None
        if isinstance(record.exc_info, tuple) and record.exc_info[0] is not None:
            text = record.exc_text or logging.Formatter().formatException(record.exc_info)
            masked = redact(text)
            if masked != text:
                record.exc_text, record.exc_info = masked, None
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(vars(record).items()):
            if key not in _STANDARD_RECORD_ATTRS and isinstance(value, str):
                setattr(record, key, redact(value))
        return True


_install_lock = threading.Lock()
# Rebound, never mutated, for the same reason as ``_redacted``: the factory reads it on any thread.
_prefixes: tuple[str, ...] = ()
_FILTER = SecretRedactingFilter()


def install_secret_redaction(logger_name: str = "boxwright") -> SecretRedactingFilter:
    """Mask registered values on ``logger_name`` and every logger below it; safe to call again.

    A filter on a logger does not apply to its children, so the filter goes on the
    named logger and on every descendant that exists now (resolving a secret calls
    this again, picking up loggers created since). A chained log-record factory
    also runs the filter on each descendant record as it is made, which covers
    loggers created later; it sees message, args, traceback and stack but not
    ``extra=`` fields, which are set after the factory returns.
    """
    global _prefixes
    with _install_lock:
        below = logger_name + "."
        existing = list(logging.Logger.manager.loggerDict.items())
        loggers = [logging.getLogger(logger_name)]
        loggers += [lg for name, lg in existing if name.startswith(below) and isinstance(lg, logging.Logger)]
        for logger in loggers:
            if not any(isinstance(f, SecretRedactingFilter) for f in logger.filters):
                logger.addFilter(_FILTER)
        if not _prefixes:
            _chain_record_factory()
        if logger_name not in _prefixes:
            _prefixes = (*_prefixes, logger_name)
    return _FILTER


def _chain_record_factory() -> None:
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if _redacted and any(record.name.startswith(prefix + ".") for prefix in _prefixes):
            _FILTER.filter(record)
        return record

    logging.setLogRecordFactory(factory)
