"""The secret scanner the cloud rules tests run over a fake's records: it finds a value whole, in pieces, split
across calls and encoded, and passes a clean log."""

from __future__ import annotations

import base64

from tests.support.secret_scan import fresh_secret, secret_pieces


def test_a_clean_log_has_no_hits() -> None:
    secret = fresh_secret()
    assert secret_pieces(['printf %s "$BW_SECRET" | wc -c', "mkdir -p /workspace", "{'owner': 'bw'}"], secret) == []


def test_the_whole_value_and_a_piece_of_it_are_found() -> None:
    secret = fresh_secret()
    assert secret_pieces([f"export K={secret}"], secret)
    assert secret_pieces([f"printf '{secret[5:17]}' >> /tmp/e"], secret)


def test_a_value_split_across_calls_is_found() -> None:
    secret = fresh_secret()
    # Pieces shorter than the piece length each, but consecutive: only the join shows them.
    halves = [secret[i : i + 9] for i in range(0, len(secret), 9)]
    assert all(secret_pieces([h], secret) == [] for h in halves)
    assert secret_pieces(halves, secret)


def test_an_encoded_value_is_found_also_when_split() -> None:
    secret = fresh_secret()
    encoded = base64.b64encode(f"export K='{secret}'".encode()).decode()
    assert secret_pieces([f"echo {encoded} | base64 -d > /tmp/env"], secret)
    assert secret_pieces([f"printf {secret.encode().hex()} | xxd -r -p"], secret)
    cut = len(encoded) // 2 // 4 * 4
    assert secret_pieces([f"echo {encoded[:cut]} >> /tmp/b", f"echo {encoded[cut:]} >> /tmp/b"], secret)
