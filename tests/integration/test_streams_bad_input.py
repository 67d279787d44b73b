"""Bad input to `boxwright serve --streams` gets the status codes of spec durable-streams.md §1.16, never a 500."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import httpx
import pytest

from tests.support.streams import streams_server

CAP = 64 * 1024


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    db = tmp_path_factory.mktemp("streams") / "streams.db"
    with streams_server(db, max_body=CAP) as url, httpx.Client(base_url=url, timeout=10.0) as http:
        yield http


def _stream(client: httpx.Client, content_type: str = "text/plain", body: bytes = b"hello") -> str:
    path = f"/v1/stream/bad-{uuid.uuid4().hex[:12]}"
    created = client.put(path, headers={"content-type": content_type}, content=body)
    assert created.status_code == 201, created.text
    return path


@pytest.mark.parametrize(
    "query",
    [
        "offset=abc",
        "offset=",
        "offset=0,1",
        "offset=..%2F..%2Fetc",
        "offset=0000000000000000_00000000000000%0A5",
        "offset=-2",
        "offset=a&offset=b",
        "offset=0000000000000000_0000000000000005&offset=0000000000000000_0000000000000005",
        # well formed, never issued: past the tail, and a prefix this server never writes
        "offset=0000000000000000_0000000000009999",
        "offset=0000000000000001_0000000000000000",
        "live=sse",
        "live=long-poll",
        "offset=-1&live=forever",
    ],
)
def test_malformed_or_foreign_offsets_are_400(client: httpx.Client, query: str) -> None:
    path = _stream(client)
    answer = client.get(f"{path}?{query}")
    assert answer.status_code == 400, (query, answer.status_code, answer.text)
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.text  # says what is wrong
    # The stream still reads: the bad request changed nothing.
    assert client.get(f"{path}?offset=-1").content == b"hello"


def test_producer_epoch_going_backwards_is_403_with_the_current_epoch(client: httpx.Client) -> None:
    path = _stream(client)

    def append(epoch: int, seq: int) -> httpx.Response:
        headers = {"content-type": "text/plain", "producer-id": "p", "producer-epoch": str(epoch)}
        return client.post(path, headers={**headers, "producer-seq": str(seq)}, content=f"{epoch}.{seq}")

    assert append(3, 0).status_code == 200
    assert append(5, 0).status_code == 200
    stale = append(4, 1)
    assert stale.status_code == 403, stale.text
    assert stale.headers["producer-epoch"] == "5"
    assert append(0, 0).status_code == 403
    assert client.get(f"{path}?offset=-1").content == b"hello3.05.0"
    # New epochs start at seq 0, and partial or signed producer headers are bad requests.
    assert append(6, 2).status_code == 400
    partial = client.post(path, headers={"content-type": "text/plain", "producer-id": "p"}, content=b"x")
    assert partial.status_code == 400
    signed = client.post(
        path,
        headers={"content-type": "text/plain", "producer-id": "p", "producer-epoch": "-1", "producer-seq": "0"},
        content=b"x",
    )
    assert signed.status_code == 400


def test_append_to_a_closed_stream_is_409_with_closed_and_offset(client: httpx.Client) -> None:
    path = _stream(client)
    closed = client.post(path, headers={"stream-closed": "true"})
    assert closed.status_code == 204
    assert closed.headers["stream-closed"] == "true"
    refused = client.post(path, headers={"content-type": "text/plain"}, content=b"late")
    assert refused.status_code == 409, refused.text
    assert refused.headers["stream-closed"] == "true"
    assert refused.headers["stream-next-offset"] == closed.headers["stream-next-offset"]
    assert client.get(f"{path}?offset=-1").content == b"hello"


def test_a_body_over_the_cap_is_413_and_nothing_is_stored(client: httpx.Client) -> None:
    path = _stream(client, "application/octet-stream", b"")
    over = client.post(path, headers={"content-type": "application/octet-stream"}, content=b"x" * (CAP + 1))
    assert over.status_code == 413, over.text

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap holds for chunked bodies too
        for _ in range(CAP // 1024 + 1):
            yield b"y" * 1024

    chunked = client.post(path, headers={"content-type": "application/octet-stream"}, content=chunks())
    assert chunked.status_code == 413
    created = client.put(
        f"/v1/stream/big-{uuid.uuid4().hex[:8]}", headers={"content-type": "text/plain"}, content=b"z" * (CAP + 1)
    )
    assert created.status_code == 413
    assert client.get(f"{path}?offset=-1").content == b""
    at_cap = client.post(path, headers={"content-type": "application/octet-stream"}, content=b"x" * CAP)
    assert at_cap.status_code == 204


def test_an_unknown_content_type_is_409_and_a_malformed_one_400(client: httpx.Client) -> None:
    path = _stream(client, "application/json", b"[]")
    other = client.post(path, headers={"content-type": "application/x-unknown"}, content=b'{"a":1}')
    assert other.status_code == 409, other.text
    malformed = client.post(path, headers={"content-type": "not a media type"}, content=b'{"a":1}')
    assert malformed.status_code == 400, malformed.text
    missing = client.post(path, content=b'{"a":1}', headers={"content-type": ""})
    assert missing.status_code == 400
    assert client.put(f"{path}-x", headers={"content-type": "nonsense"}).status_code == 400
    invalid_json = client.post(path, headers={"content-type": "application/json"}, content=b"{nope")
    assert invalid_json.status_code == 400
    assert client.post(path, headers={"content-type": "application/json"}, content=b"[]").status_code == 400
    # The matching type, in another case and with parameters, is the same type.
    same = client.post(path, headers={"content-type": "Application/JSON; charset=utf-8"}, content=b'{"a":1}')
    assert same.status_code == 204
    assert client.get(f"{path}?offset=-1").json() == [{"a": 1}]


@pytest.mark.parametrize(
    "headers",
    [
        {"stream-ttl": "-1"},
        {"stream-ttl": "01"},
        {"stream-ttl": "1.5"},
        {"stream-expires-at": "tomorrow"},
        {"stream-ttl": "10", "stream-expires-at": "2099-01-01T00:00:00Z"},
        {"stream-fork-sub-offset": "0"},
    ],
)
def test_bad_create_headers_are_400(client: httpx.Client, headers: dict[str, str]) -> None:
    answer = client.put(f"/v1/stream/create-{uuid.uuid4().hex[:8]}", headers={"content-type": "text/plain", **headers})
    assert answer.status_code == 400, (headers, answer.text)


def test_missing_and_deleted_streams(client: httpx.Client) -> None:
    path = _stream(client)
    assert client.delete(path).status_code == 204
    for method in ("GET", "HEAD", "DELETE"):
        assert client.request(method, path).status_code == 404
    assert client.post(path, headers={"content-type": "text/plain"}, content=b"x").status_code == 404
