"""Scan what a fake cloud recorded for a secret, also when it arrives in pieces.

A provider that keeps a value out of each single command string can still leak it by
splitting it: ``printf 'bw-sec' >> f`` then ``printf 'ret' >> f``, or a base64 line cut
over two calls. So a record log (commands, labels, metadata, the env a snapshot keeps) is
clean only when none of these holds:

- the value, or any piece of it at least ``piece`` characters long, is in one record;
- the value is in the records joined in their order (a split across consecutive calls);
- the value is in the base64 or hex decoding of a record's tokens, or of the joined tokens.

Tests use a random value (``fresh_secret``) so a piece of it cannot occur by chance.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from collections.abc import Iterable

_B64 = re.compile(r"[A-Za-z0-9+/_-]{8,}={0,2}")
_HEX = re.compile(r"(?:[0-9a-fA-F]{2}){6,}")


def fresh_secret(prefix: str = "bwsec") -> str:
    """A value no command, label or id of a test run can contain by chance (38 characters)."""
    return f"{prefix}-{secrets.token_hex(16)}"


def _decodings(text: str) -> list[str]:
    found: list[str] = []
    for token in _B64.findall(text):
        padded = token + "=" * (-len(token) % 4)
        for decode in (base64.b64decode, base64.urlsafe_b64decode):
            try:
                found.append(decode(padded).decode("utf-8", "replace"))
            except (binascii.Error, ValueError):
                continue
    for token in _HEX.findall(text):
        found.append(bytes.fromhex(token).decode("utf-8", "replace"))
    return found


def secret_pieces(records: Iterable[str], secret: str, piece: int = 10) -> list[str]:
    """Where ``secret`` (or a piece of it) shows in ``records``; empty when the log is clean."""
    rows = [str(r) for r in records]
    pieces = {secret[i : i + piece] for i in range(len(secret) - piece + 1)} if len(secret) > piece else {secret}
    hits: list[str] = []

    def scan(where: str, text: str) -> None:
        if secret in text:
            hits.append(f"{where}: the whole value")
            return
        for p in pieces:
            if p in text:
                hits.append(f"{where}: the piece {p!r}")
                return

    for n, row in enumerate(rows):
        scan(f"record {n} ({row[:80]!r})", row)
        for decoded in _decodings(row):
            scan(f"record {n}, decoded", decoded)
    joined = "".join(rows)
    if secret in joined and not hits:
        hits.append("the records joined in order: the whole value, split across calls")
    tokens = "".join(t for row in rows for t in _B64.findall(row))
    for decoded in _decodings(tokens):
        if secret in decoded and not hits:
            hits.append("the records' base64 tokens joined: the whole value, split across calls")
    return hits
