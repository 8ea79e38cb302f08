"""A minimal asyncio HTTP/1.1 client over one keep-alive connection, for timing a server.

``python -m loadgen probe --overhead`` times what slicegate's serving path adds to a
request. Through ``httpx`` every round trip also carries httpx's own Python (about
0.7 ms per ``GET /health`` on a 2-core machine), which the probe would count as the
server's. This client does the least a round trip needs: the request in one write
on a ``TCP_NODELAY`` socket, the status line and headers in one read, the body by
``Content-Length``, chunked transfer encoding or until the server closes. The probe
times its requests through it and reports httpx's extra on a line of its own.

Not supported: TLS, proxies, redirects, compression, cookies, HTTP/2, pipelining,
``Expect: 100-continue``, bare ``\\r`` line ends in ``iter_lines``, timeouts (wrap a
call in ``asyncio.timeout``).

NOTE: one request at a time, and ``connect()`` (which ``request()`` calls) reopens the
connection when it cannot carry the next request: the server closed it (``Connection:
close``, an HTTP/1.0 or close-delimited response, or an idle keep-alive timeout seen
before the request), or the last response was not read to its end (its bytes would
be read as the next response's). A timer that must not include a reconnection
starts after ``await connect()``; ``connects`` counts the TCP connections opened. A
connection that closes during a request raises ``LeanHTTPError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator, Callable
from types import TracebackType

_HEAD_END = b"\r\n\r\n"
_READ_BYTES = 65536
_HEX = re.compile(rb"[0-9a-fA-F]+")
_OWN_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding"})


class LeanHTTPError(Exception):
    """The connection closed during a request, or the response is not the HTTP/1.x expected."""


async def _read_line(reader: asyncio.StreamReader) -> bytes:
    """One CRLF-ended line of the response, without its CRLF."""
    return (await _read_until(reader, b"\r\n"))[:-2]


async def _read_until(reader: asyncio.StreamReader, end: bytes) -> bytes:
    try:
        return await reader.readuntil(end)
    except asyncio.IncompleteReadError as exc:
        raise LeanHTTPError(f"connection closed mid-response (after {len(exc.partial)} bytes "
                            "of a line)") from None
    except asyncio.LimitOverrunError as exc:
        raise LeanHTTPError(f"response line over {exc.consumed} bytes") from None
    except ConnectionError as exc:
        raise LeanHTTPError(f"connection lost: {exc!r}") from exc


async def _read_some(reader: asyncio.StreamReader, most: int) -> bytes:
    """Up to ``most`` bytes, as soon as any have arrived; b"" at the end of the stream."""
    try:
        return await reader.read(most)
    except ConnectionError as exc:
        raise LeanHTTPError(f"connection lost: {exc!r}") from exc


def _text(line: bytes) -> str:
    return line.removesuffix(b"\r").decode("utf-8", "replace")


class LeanResponse:
    """One response: ``status``, ``headers`` (lowercased names, repeats joined by ", ") and a
    body read on demand, by ``read()`` or ``iter_lines()``, as it arrives."""

    def __init__(self, status: int, headers: dict[str, str], reader: asyncio.StreamReader,
                 framing: tuple[bool, int | None], on_end: Callable[[bool], None]) -> None:
        self.status = status
        self.headers = headers
        self._reader = reader
        # bytes left in the current chunk or in the Content-Length body; None: until EOF
        self._chunked, self._left = framing
        self._in_chunks = False  # a chunk's data was read: its CRLF comes before the next size
        self._on_end = on_end  # called once, with True where the body broke off
        self.complete = False  # the body was read to its end
        self._broken = False  # reading the body failed: the connection was dropped
        if self._left == 0 and not self._chunked:
            self._end(broken=False)

    async def read(self) -> bytes:
        """The body's bytes not consumed yet (all of it unless ``iter_lines`` ran first)."""
        parts = []
        while piece := await self._next_piece():
            parts.append(piece)
        return b"".join(parts)

    async def iter_lines(self) -> AsyncIterator[str]:
        """The body's lines (UTF-8, without ``\\n`` or ``\\r\\n``), each as soon as it has
        arrived; a line split across chunks is joined first."""
        pending = b""
        while piece := await self._next_piece():
            *lines, pending = (pending + piece).split(b"\n")
            for line in lines:
                yield _text(line)
        if pending:
            yield _text(pending)

    async def _next_piece(self) -> bytes:
        """The next bytes of the body as they arrive; b"" once it has ended."""
        if self.complete:
            return b""
        if self._broken:
            raise LeanHTTPError("the body broke off earlier; its connection was closed")
        try:
            return await self._piece()
        except BaseException:
            self._end(broken=True)
            raise

    async def _piece(self) -> bytes:
        if self._chunked and self._left == 0:
            self._left = await self._chunk_size()
            if self._left == 0:
                await self._skip_trailers()
                self._end(broken=False)
                return b""
        piece = await _read_some(self._reader, min(self._left or _READ_BYTES, _READ_BYTES))
        if not piece:
            if self._left is not None:
                raise LeanHTTPError(f"connection closed mid-body ({self._left} bytes missing)")
            self._end(broken=False)  # a close-delimited body has ended
        elif self._left is not None:
            self._left -= len(piece)
            if self._left == 0 and not self._chunked:
                self._end(broken=False)
        return piece

    async def _chunk_size(self) -> int:
        line = await _read_line(self._reader)
        if self._in_chunks:  # the CRLF that ends the last chunk's data
            if line:
                raise LeanHTTPError("chunk data longer than its size")
            line = await _read_line(self._reader)
        self._in_chunks = True
        size = line.split(b";", 1)[0].strip()  # NOTE: chunk extensions are ignored
        if not _HEX.fullmatch(size):
            raise LeanHTTPError(f"bad chunk size line {line[:40]!r}")
        return int(size, 16)

    async def _skip_trailers(self) -> None:
        while await _read_line(self._reader):
            pass

    def _end(self, *, broken: bool) -> None:
        self.complete, self._broken = not broken, broken
        self._on_end(broken)


def _parse_head(head: bytes) -> tuple[str, int, dict[str, str]]:
    """HTTP version, status and headers of a response head (its status line and headers)."""
    status_line, *lines = head.removesuffix(_HEAD_END).decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not re.fullmatch(r"\d{3}",
                                                                                  parts[1]):
        raise LeanHTTPError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name.strip():
            raise LeanHTTPError(f"bad header line: {line[:80]!r}")
        key, value = name.strip().lower(), value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return parts[0], int(parts[1]), headers


def _framing(method: str, status: int, headers: dict[str, str]) -> tuple[bool, int | None]:
    """(chunked, length) of the body: (True, 0) chunked, (False, None) until the server
    closes, else (False, its Content-Length)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return False, 0
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return True, 0
    if "content-length" not in headers:
        return False, None
    text = headers["content-length"].split(",")[0].strip()
    if not text.isdigit():
        raise LeanHTTPError(f"bad Content-Length {headers['content-length']!r}")
    return False, int(text)


def _keeps_alive(version: str, headers: dict[str, str], framing: tuple[bool, int | None]) -> bool:
    tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
    if "close" in tokens or framing == (False, None):
        return False
    return version != "HTTP/1.0" or "keep-alive" in tokens


def _request_bytes(method: str, path: str, host: str, body: bytes | None,
                   headers: dict[str, str]) -> bytes:
    """The request line, headers and body, to be sent in one write."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Connection: keep-alive"]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    for name, value in headers.items():
        if name.lower() in _OWN_HEADERS:
            raise ValueError(f"header {name!r} is set by LeanConnection")
        if any(c in name + value for c in "\r\n"):
            raise ValueError(f"line break in header {name!r}")
        lines.append(f"{name}: {value}")
    return "\r\n".join(lines).encode("latin-1") + _HEAD_END + (body or b"")


class LeanConnection:
    """One keep-alive HTTP/1.1 connection to ``host:port``, one request at a time."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.connects = 0  # TCP connections opened
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._response: LeanResponse | None = None  # the last one, while it may be unread

    @classmethod
    async def open(cls, host: str, port: int) -> LeanConnection:
        """A connection to ``host:port``, connected."""
        connection = cls(host, port)
        await connection.connect()
        return connection

    async def __aenter__(self) -> LeanConnection:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the TCP connection unless the open one can carry the next request."""
        if self._response is not None and not self._response.complete:
            self._drop()
        if self._reader is not None and not self._reader.at_eof():
            return
        self._drop()
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        sock = self._writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connects += 1

    async def request(self, method: str, path: str, body: bytes | None = None,
                      headers: dict[str, str] | None = None) -> LeanResponse:
        """Send one request; -> its response once the status line and headers are in.

        The body, if any, is sent as is with its Content-Length (set ``Content-Type`` in
        ``headers``); Host, Content-Length and Connection are the client's own."""
        await self.connect()
        assert self._reader is not None and self._writer is not None
        reader, writer = self._reader, self._writer
        data = _request_bytes(method, path, f"{self.host}:{self.port}", body, headers or {})
        try:
            writer.write(data)
            await writer.drain()
            version, status, head = await self._read_head(reader)
            framing = _framing(method, status, head)
        except ConnectionError as exc:
            self._drop()
            raise LeanHTTPError(f"connection lost: {exc!r}") from exc
        except BaseException:
            self._drop()
            raise
        keep = _keeps_alive(version, head, framing)
        self._response = LeanResponse(status, head, reader, framing,
                                      lambda broken: self._on_body_end(writer, broken, keep))
        return self._response

    async def close(self) -> None:
        """Close the connection (the next request would open a new one)."""
        writer = self._writer
        self._drop()
        if writer is not None:
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    @staticmethod
    async def _read_head(reader: asyncio.StreamReader) -> tuple[str, int, dict[str, str]]:
        while True:  # NOTE: informational (1xx) responses before the real one are skipped
            head = await _read_until(reader, _HEAD_END)
            version, status, headers = _parse_head(head)
            if not 100 <= status < 200 or status == 101:
                return version, status, headers

    def _on_body_end(self, writer: asyncio.StreamWriter, broken: bool, keep: bool) -> None:
        if (broken or not keep) and writer is self._writer:
            self._drop()

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None
        self._response = None
