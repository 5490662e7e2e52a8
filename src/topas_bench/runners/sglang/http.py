"""A small asyncio HTTP/1.1 client for OpenAI-compatible servers (stdlib only).

One connection per request (`Connection: close`): a benchmark client wants each request's
timing isolated, and the server is local or one hop away. Supports JSON bodies, chunked and
length-delimited responses, and server-sent events for streaming completions.

Errors: `TransientError` for what a retry may fix (connection refused or reset, timeouts,
HTTP 429 and 5xx); `RequestError` for the rest (other 4xx, unparseable answers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from topas_bench.errors import TopasError


class RequestError(TopasError):
    """A request the server refused or answered with something unusable."""


class TransientError(RequestError):
    """A failure a retry may fix: connection trouble, a timeout, HTTP 429 or 5xx."""


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def _open(
    method: str, url: str, body: Any, deadline: float
) -> tuple[_Conn, int, dict[str, str]]:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme not in ("http", ""):
        raise RequestError(f"{url}: only http:// endpoints are supported")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    data = json.dumps(body).encode() if body is not None else b""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port), _left(deadline, url)
        )
    except (OSError, TimeoutError) as e:
        raise TransientError(f"cannot connect to {host}:{port} ({_why(e)})") from None
    conn = _Conn(reader, writer)
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n"
        f"Accept: application/json, text/event-stream\r\n"
    )
    if body is not None:
        head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
    try:
        writer.write(head.encode() + b"\r\n" + data)
        await writer.drain()
        status_line = await _read(reader.readline(), deadline, url)
        if not status_line:
            raise TransientError(f"{url}: the server closed the connection without answering")
        try:
            status = int(status_line.split()[1])
        except (IndexError, ValueError):
            raise RequestError(f"{url}: not an HTTP answer: {status_line[:80]!r}") from None
        headers: dict[str, str] = {}
        while True:
            line = await _read(reader.readline(), deadline, url)
            if line in (b"\r\n", b"\n", b""):
                break
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
    except OSError as e:
        await conn.close()
        raise TransientError(f"{url}: connection lost ({_why(e)})") from None
    except BaseException:
        await conn.close()
        raise
    return conn, status, headers


async def _chunks(
    conn: _Conn, headers: dict[str, str], deadline: float, url: str
) -> AsyncIterator[bytes]:
    r = conn.reader
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await _read(r.readline(), deadline, url)
                if not size_line:
                    raise TransientError(f"{url}: the connection closed mid-response")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    return
                chunk = await _read(r.readexactly(size + 2), deadline, url)
                yield chunk[:-2]
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if n:
                yield await _read(r.readexactly(n), deadline, url)
        else:
            while chunk := await _read(r.read(65536), deadline, url):
                yield chunk
    except asyncio.IncompleteReadError:
        raise TransientError(f"{url}: the connection closed mid-response") from None
    except OSError as e:
        raise TransientError(f"{url}: connection lost ({_why(e)})") from None


async def request_json(method: str, url: str, body: Any = None, timeout_s: float = 30.0) -> Any:
    """Send a request, return the decoded JSON answer; raise on HTTP errors."""
    deadline = time.monotonic() + timeout_s
    conn, status, headers = await _open(method, url, body, deadline)
    try:
        raw = b"".join([c async for c in _chunks(conn, headers, deadline, url)])
    finally:
        await conn.close()
    _check_status(status, raw, url)
    try:
        return json.loads(raw) if raw else None
    except (ValueError, RecursionError):
        raise RequestError(f"{url}: answer is not JSON: {raw[:200]!r}") from None


async def stream_events(
    url: str, body: Any, timeout_s: float
) -> AsyncIterator[tuple[float, dict[str, Any]]]:
    """POST `body` and yield `(arrival time, event)` for each server-sent `data:` event."""
    deadline = time.monotonic() + timeout_s
    conn, status, headers = await _open("POST", url, body, deadline)
    try:
        if status != 200:
            raw = b"".join([c async for c in _chunks(conn, headers, deadline, url)])
            _check_status(status, raw, url)
        buf = b""
        async for chunk in _chunks(conn, headers, deadline, url):
            t = time.monotonic()
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                try:
                    event = json.loads(payload)
                except (ValueError, RecursionError):
                    raise RequestError(f"{url}: bad event: {payload[:200]!r}") from None
                if isinstance(event, dict) and "error" in event and "choices" not in event:
                    raise RequestError(f"{url}: server error in stream: {event['error']}")
                yield t, event
        # OpenAI-compatible servers end a stream with [DONE]; without it, it was cut off.
        raise TransientError(f"{url}: the stream ended before [DONE] (connection lost)")
    finally:
        await conn.close()


def _check_status(status: int, raw: bytes, url: str) -> None:
    if status < 400:
        return
    msg = raw[:300].decode("utf-8", "replace")
    if status == 429 or status >= 500:
        raise TransientError(f"{url}: HTTP {status}: {msg}")
    raise RequestError(f"{url}: HTTP {status}: {msg}")


async def _read(aw: Any, deadline: float, url: str) -> Any:
    try:
        return await asyncio.wait_for(aw, _left(deadline, url))
    except TimeoutError:
        raise TransientError(f"{url}: timed out") from None


def _left(deadline: float, url: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise TransientError(f"{url}: timed out")
    return left


def _why(e: BaseException) -> str:
    return getattr(e, "strerror", None) or type(e).__name__
