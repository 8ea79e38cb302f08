"""loadgen.leanhttp against a tiny asyncio HTTP/1.1 server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import pytest

from loadgen.leanhttp import LeanConnection, LeanHTTPError

# a route writes its response; False closes the connection after it
Route = Callable[[asyncio.StreamWriter, bytes], Awaitable[bool]]


class Server:
    """Serves ``routes`` by path, keeps connections alive, counts them and logs requests."""

    def __init__(self, routes: Mapping[str, Route]) -> None:
        self.routes = routes
        self.connections = 0
        self.requests: list[bytes] = []  # each request's head and body, as received
        self.times: dict[str, float] = {}  # what a route did when, time.monotonic()
        self._handlers: dict[asyncio.Task, asyncio.StreamWriter] = {}

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers[task] = writer
        try:
            while await self._one(reader, writer):
                pass
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        """Close every connection and wait for its handler to return (none is cancelled)."""
        for writer in self._handlers.values():
            writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        length = 0
        for line in head.decode("latin-1").split("\r\n")[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        body = await reader.readexactly(length)
        self.requests.append(head + body)
        keep = await self.routes[head.split(b" ")[1].decode()](writer, body)
        await writer.drain()
        return keep


@contextlib.asynccontextmanager
async def serving(routes: Mapping[str, Route]) -> AsyncIterator[tuple[Server, int]]:
    server = Server(routes)
    listener = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    try:
        yield server, listener.sockets[0].getsockname()[1]
    finally:
        listener.close()
        await listener.wait_closed()
        await server.stop()


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


CHUNKED = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")


async def echo(writer: asyncio.StreamWriter, body: bytes) -> bool:
    data = json.dumps({"body": body.decode()}).encode()
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Twice: a\r\n"
                 b"x-twice: b\r\n" + f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return True


async def sends(writer: asyncio.StreamWriter, *parts: bytes, pause_s: float = 0.0,
                keep: bool = True) -> bool:
    for part in parts:
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(pause_s)
    return keep


async def test_a_json_body_by_content_length() -> None:
    async with serving({"/echo": echo}) as (server, port), \
            LeanConnection(host="127.0.0.1", port=port) as conn:
        response = await conn.request("POST", "/echo", b'{"a": 1}',
                                      {"Content-Type": "application/json", "X-Key": "k"})
        assert response.status == 200
        assert response.headers["content-type"] == "application/json"
        assert response.headers["x-twice"] == "a, b"
        assert json.loads(await response.read()) == {"body": '{"a": 1}'}
        assert response.complete and await response.read() == b""
    sent = server.requests[0].decode()
    assert sent.startswith("POST /echo HTTP/1.1\r\n")
    for line in (f"Host: 127.0.0.1:{port}", "Connection: keep-alive", "Content-Length: 8",
                 "Content-Type: application/json", "X-Key: k"):
        assert f"\r\n{line}\r\n" in sent
    assert sent.endswith('\r\n\r\n{"a": 1}')


async def test_a_request_is_one_write_on_a_nodelay_socket() -> None:
    async with serving({"/echo": echo}) as (_, port), await LeanConnection.open("127.0.0.1",
                                                                                   port) as conn:
        writer = conn._writer  # NOTE: the test looks inside: what goes on the wire, and how
        assert writer is not None
        sock = writer.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        writes: list[bytes] = []
        write = writer.write

        def spy(data: bytes | bytearray | memoryview) -> None:
            writes.append(bytes(data))
            write(data)

        writer.write = spy  # type: ignore[method-assign]
        await (await conn.request("POST", "/echo", b"xyz", {})).read()
    assert len(writes) == 1 and writes[0].startswith(b"POST /echo ") and writes[0].endswith(b"xyz")


async def test_sse_lines_arrive_as_their_chunks_do() -> None:
    async def sse(writer: asyncio.StreamWriter, body: bytes) -> bool:
        await sends(writer, CHUNKED + chunk(b"data: 1\n\n"), pause_s=0.2)
        server.times["last_chunk"] = time.monotonic()
        return await sends(writer, chunk(b"data: 2\n\n") + chunk(b""))

    arrivals: list[tuple[str, float]] = []
    async with serving({"/sse": sse}) as (server, port), LeanConnection("127.0.0.1", port) as conn:
        response = await conn.request("GET", "/sse")
        async for line in response.iter_lines():
            arrivals.append((line, time.monotonic()))
        assert response.complete
    assert [line for line, _ in arrivals] == ["data: 1", "", "data: 2", ""]
    assert arrivals[0][1] < server.times["last_chunk"]  # not held until the body ended


async def test_a_line_split_across_chunks_is_joined() -> None:
    async def split(writer: asyncio.StreamWriter, body: bytes) -> bool:
        # NOTE: each chunk is a read of its own, however TCP packs them
        return await sends(writer, CHUNKED, chunk(b"data: hel"), chunk(b"lo wor"),
                           chunk(b"ld\r"), chunk(b"\n\ndata: \xc3"),
                           b"6;ext=1\r\n\xa9\nlast\r\n",  # a chunk extension, ignored
                           b"0\r\nX-Trailer: 1\r\n\r\n", pause_s=0.01)

    async with serving({"/split": split, "/echo": echo}) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        lines = [line async for line in (await conn.request("GET", "/split")).iter_lines()]
        assert lines == ["data: hello world", "", "data: é", "last"]
        # the trailers were read: the next response is read from its own first byte
        assert (await (await conn.request("GET", "/echo")).read()).startswith(b'{"body"')
        assert server.connections == 1


async def test_keep_alive_reuses_one_connection_until_the_server_closes_it() -> None:
    async def close(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, b"HTTP/1.1 200 OK\r\nConnection: close\r\n"
                                   b"Content-Length: 3\r\n\r\nbye", keep=False)

    async with serving({"/echo": echo, "/close": close}) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        for _ in range(2):
            await (await conn.request("GET", "/echo")).read()
        assert server.connections == 1 and conn.connects == 1
        assert await (await conn.request("GET", "/close")).read() == b"bye"
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        assert server.connections == 2 and conn.connects == 2  # reopened for the request after


async def test_a_connection_the_server_closed_while_idle_is_reopened() -> None:
    async def bye(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", keep=False)

    async with serving({"/bye": bye, "/echo": echo}) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        assert await (await conn.request("GET", "/bye")).read() == b"ok"
        for _ in range(500):  # NOTE: until the server's close has arrived (a busy CI machine)
            if conn._reader is None or conn._reader.at_eof():
                break
            await asyncio.sleep(0.01)
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        assert server.connections == 2


async def test_an_unread_response_is_not_taken_for_the_next() -> None:
    async def sse(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, CHUNKED + chunk(b"data: 1\n\n"), chunk(b"data: 2\n\n"),
                           chunk(b""), pause_s=0.05)

    async with serving({"/sse": sse, "/echo": echo}) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        response = await conn.request("GET", "/sse")
        async for _ in response.iter_lines():
            break
        assert not response.complete
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        assert conn.connects == 2 and server.connections == 2


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789",  # short of its length
    CHUNKED + chunk(b"data: 1\n") + b"20\r\ndata: ",  # inside a chunk
    CHUNKED + chunk(b"data: 1\n") + b"2",  # inside a chunk size line
])
async def test_a_connection_closed_mid_body_raises(reply: bytes) -> None:
    async def cut(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, reply, keep=False)

    async with serving({"/cut": cut, "/echo": echo}) as (_, port), \
            LeanConnection("127.0.0.1", port) as conn:
        response = await conn.request("GET", "/cut")
        with pytest.raises(LeanHTTPError, match="closed mid-"):
            await response.read()
        assert not response.complete
        with pytest.raises(LeanHTTPError, match="broke off earlier"):
            await response.read()
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'  # reopened


@pytest.mark.parametrize(("reply", "error"), [
    (b"", "closed mid-response"),
    (b"HTTP/1.1 200 OK\r\nContent-Le", "closed mid-response"),
    (b"SPDY/3 200 OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 2xx OK\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "bad header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
])
async def test_a_malformed_head_raises(reply: bytes, error: str) -> None:
    async def bad(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, reply, keep=False)

    async with serving({"/bad": bad}) as (_, port), LeanConnection("127.0.0.1", port) as conn:
        with pytest.raises(LeanHTTPError, match=error):
            await conn.request("GET", "/bad")


@pytest.mark.parametrize(("body", "error"), [
    (b"zz\r\n", "bad chunk size"),
    (b"-1\r\n", "bad chunk size"),
    (b"2\r\nabc\r\n", "chunk data longer than its size"),
])
async def test_a_malformed_chunk_raises(body: bytes, error: str) -> None:
    async def bad(writer: asyncio.StreamWriter, request: bytes) -> bool:
        return await sends(writer, CHUNKED + body + b"0\r\n\r\n")

    async with serving({"/bad": bad}) as (_, port), LeanConnection("127.0.0.1", port) as conn:
        response = await conn.request("GET", "/bad")
        with pytest.raises(LeanHTTPError, match=error):
            await response.read()


async def test_bodies_without_a_length() -> None:
    async def empty(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, b"HTTP/1.1 204 No Content\r\n\r\n")

    async def head(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n")

    async def until_close(writer: asyncio.StreamWriter, body: bytes) -> bool:
        return await sends(writer, b"HTTP/1.1 200 OK\r\n\r\nall ", b"of it", pause_s=0.01,
                           keep=False)

    routes = {"/empty": empty, "/head": head, "/eof": until_close, "/echo": echo}
    async with serving(routes) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        response = await conn.request("DELETE", "/empty")
        assert response.status == 204 and response.complete and await response.read() == b""
        assert await (await conn.request("HEAD", "/head")).read() == b""  # 50 bytes, not sent
        assert await (await conn.request("GET", "/eof")).read() == b"all of it"
        assert server.connections == 1
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        assert server.connections == 2


async def test_headers_the_client_owns_or_line_breaks_are_refused() -> None:
    async with serving({"/echo": echo}) as (server, port), \
            LeanConnection("127.0.0.1", port) as conn:
        with pytest.raises(ValueError, match="set by LeanConnection"):
            await conn.request("POST", "/echo", b"x", {"content-length": "5"})
        with pytest.raises(ValueError, match="line break"):
            await conn.request("GET", "/echo", None, {"X-A": "1\r\nX-B: 2"})
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        assert server.connections == 1 and len(server.requests) == 1


async def test_a_closed_connection_reopens_on_the_next_request() -> None:
    async with serving({"/echo": echo}) as (server, port):
        conn = await LeanConnection.open("127.0.0.1", port)
        await conn.close()
        assert await (await conn.request("GET", "/echo")).read() == b'{"body": ""}'
        await conn.close()
        assert conn.connects == 2 and server.connections == 2
