"""Forwarding one leased request to one runtime, and relaying its answer to the client."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx
from starlette.background import BackgroundTask
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from service.errors import HandedOver, RequestRejected, RuntimeFailed, RuntimeTimeout
from service.live.leases import Lease, LeaseProvider, Outcome
from service.live.usage import AnswerUsage
from service.proxy.dialects import ANTHROPIC
from service.proxy.message_start import MessageStart
from service.proxy.request import ClientRequest, ProxyConfig, new_request_id
from service.proxy.successor import relay_to_successor
from service.proxy.usage import answer_usage, tokens_in
from service.proxy.watchers import Acker, DisconnectWatch, Silence

log = logging.getLogger("vramd.proxy")

ERROR_TEXT_LIMIT = 4096  # of an upstream error body, handed to release() for diagnosis
# A request whose connection the runtime refused never reached it (the runtime had just
# died): it is asked for again after each pause, then answered 502 if still refused.
NOT_SENT_PAUSES_S = (0.1, 0.4)

# Response headers not passed back: hop-by-hop ones (RFC 9110 section 7.6.1), the ones
# recomputed because the body is re-framed and decoded, and the ones the server adds.
_DROPPED_RESPONSE_HEADERS = frozenset(
    b"connection keep-alive proxy-authenticate proxy-authorization proxy-connection te "
    b"trailer trailers transfer-encoding upgrade content-length content-encoding date "
    b"server".split()
)


class UpstreamBroken(Exception):
    """A runtime failed mid-way through a chunked non-SSE answer that had already begun.

    Raised out of the ASGI app on purpose: the server then drops the connection, which
    is the only way left to tell the client that the body it got is not whole.
    """

    def __init__(self, failure: RequestRejected) -> None:
        super().__init__(failure.message)
        self.outcome = Outcome(failure.code)


class ProxyResponse(Response):
    """The whole proxied exchange for one client request, run as its ASGI response.

    A router (``service.api.openai`` for ``/v1``, ``upstream`` for runtime-native paths,
    ``ollama`` for the Ollama listener) reads and checks the client's request and names the
    service and the runtime's path; ``ProxyResponse`` does the rest, as an ASGI response so
    that one object sees the whole exchange:

        acquire a lease (queue, maybe a load)  ->  the request to lease.base_url + path
        ->  relay status, headers and body     ->  release the lease, exactly once

    Answers are relayed as they come. An SSE answer (``text/event-stream``) is passed on event
    by event, never buffered; an answer of unknown length (chunked) is passed on chunk by
    chunk; an answer whose length the runtime announced (JSON, audio, images) and every error
    answer is read whole first, so a runtime that dies half-way through it becomes a clean
    502 instead of a truncated body.

    Cancellation, both ways:

    - The client hangs up. The body has been read, so the next ASGI ``receive`` message is
      ``http.disconnect``; a watcher task waits for it and cancels the exchange wherever it
      is: in the queue (the provider withdraws the request), waiting for the runtime's first
      byte, or relaying a stream. Closing the upstream response closes its connection, so the
      runtime sees the disconnect and stops generating for nobody.
    - The runtime dies or stalls. A request whose connection it refuses never reached it
      (it has just died, and the supervisor has not noticed yet): the lease is given back
      unserved (``Outcome.NOT_SENT``) and asked for again, twice, so the request waits in
      the queue for the instance that replaces it. Once sent, before the answer has started:
      502 ``runtime_failed`` or 504 ``runtime_timeout`` (a request is never sent twice).
      Mid-stream: the client's event stream ends with an OpenAI-shaped error event (never a
      half event, never a hang). Mid-way through a chunked non-SSE body there is no way to
      say so in-band, so the connection is aborted (``UpstreamBroken``) rather than letting
      a truncated body pass for a whole one.

    Why not Starlette's ``StreamingResponse``: under ASGI 2.3 (uvicorn) it notices a
    disconnect only while streaming, not while the request waits in the queue or for the
    first byte, and a disconnect that lands while a chunk is being written leaves the body
    generator suspended, so a release in its ``finally`` would wait for the garbage collector.

    Per request this module does no JSON work at all; the router re-encodes a body only when
    ``Lease.upstream_model`` asks for a rewrite. Timeouts and header tables are built once.
    Two hooks serve other client APIs: the request's ``Dialect`` words vramd's own errors
    (Anthropic's shape on ``/v1/messages``, Ollama's on its listener), and an optional
    ``Translator`` turns the runtime's answer into another API's (the Ollama listener's JSON
    and NDJSON); without one, the runtime's bytes are relayed as they came.

    One Linux-specific courtesy: runtimes that write headers and body (or event after event)
    in separate small sends without ``TCP_NODELAY`` (Python's ``http.server``, cpp-httplib by
    default) meet the receiver's delayed ACK, and each answer stalls ~40 ms. The proxy asks
    for an immediate ACK (``TCP_QUICKACK``) once the headers are in and after every relayed
    chunk: one ``setsockopt`` each, and answers arrive when the runtime sends them.
    """

    def __init__(
        self,
        *,
        leases: LeaseProvider,
        service: str,
        request: ClientRequest,
        config: ProxyConfig,
        request_id: str | None = None,
    ) -> None:
        # Response.__init__ would render a body; this response produces its own.
        self.status_code = 200
        self.background: BackgroundTask | None = None
        self._leases = leases
        self._service = service
        self._request = request
        self._config = config
        self._request_id = request_id or new_request_id()
        # What the runtime answered, for usage per client (set by ``_forward``).
        self._status: int | None = None
        self._usage: AnswerUsage | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = DisconnectWatch(receive)
        try:
            await self._exchange(scope, receive, watch.wrap(send))
        except asyncio.CancelledError:
            if not watch.absorbs():
                raise
        finally:
            watch.stop()
        if self.background is not None:
            await self.background()

    async def _exchange(self, scope: Scope, receive: Receive, send: Send) -> None:
        for pause in (*NOT_SENT_PAUSES_S, None):
            try:
                lease = await self._leases.acquire(
                    self._service,
                    request_id=self._request_id,
                    request_info=dict(self._request.shape),
                    client=self._request.client,
                )
            except HandedOver:
                request = self._request
                body = request.client_body if request.client_body is not None else request.body
                await relay_to_successor(scope, send, body)
                return
            except RequestRejected as exc:
                reply = self._request.dialect.reply(exc)
                reply.headers["X-Vramd-Service"] = self._service
                reply.raw_headers.extend(self._request.reply_headers)
                await reply(scope, receive, send)
                return
            # A cancellation is the client hanging up: the watcher is the only canceller.
            outcome: str = Outcome.CLIENT_GONE
            error: str | None = None
            try:
                outcome, error = await self._forward(
                    lease, scope, receive, send, may_ask_again=pause is not None
                )
            except OSError:
                pass  # ASGI 2.4 servers raise from send() once the client has gone
            except UpstreamBroken as exc:
                outcome, error = exc.outcome, str(exc)
                raise
            except Exception as exc:
                outcome, error = Outcome.PROXY_ERROR, repr(exc)
                raise
            finally:
                self._leases.release(
                    lease, outcome=outcome, error=error, status=self._status, usage=self._usage
                )
            if outcome != Outcome.NOT_SENT or pause is None:
                return
            log.info("%s; asking again for %s in %gs", error, self._service, pause)
            # Long enough for the supervisor to see the death, so the next lease waits
            # for the instance that replaces it rather than naming the dead one again.
            await asyncio.sleep(pause)

    async def _forward(
        self,
        lease: Lease,
        scope: Scope,
        receive: Receive,
        send: Send,
        *,
        may_ask_again: bool = False,
    ) -> tuple[Outcome, str | None]:
        """Send the request and relay the answer; the outcome and error for ``release``.
        ``may_ask_again``: a connection the runtime refused (the request never reached
        it: it has just died) answers nothing to the client and returns ``NOT_SENT``."""
        config = self._config
        client = lease.client
        request = self._upstream_request(lease)
        marks = _lease_headers(lease) + list(self._request.reply_headers)
        if self._request.translator is not None:
            self._request.translator.leased(lease.queue_ms, lease.cold_start)
        try:
            async with asyncio.timeout(config.first_byte_timeout):
                upstream = await client.send(request, stream=True)
        except (TimeoutError, httpx.TimeoutException) as exc:
            failure: RequestRejected
            if isinstance(exc, httpx.ConnectTimeout):
                failure = _failed(lease, "did not accept the connection", exc)
            else:
                failure = _timed_out(lease, "before its answer began", config.first_byte_timeout)
            return await self._answer_failure(failure, marks, scope, receive, send)
        except httpx.ConnectError as exc:
            failure = _failed(lease, "could not be reached", exc)
            if may_ask_again:
                return Outcome.NOT_SENT, failure.message
            return await self._answer_failure(failure, marks, scope, receive, send)
        except httpx.RequestError as exc:
            failure = _failed(lease, "dropped the connection before answering", exc)
            return await self._answer_failure(failure, marks, scope, receive, send)

        if lease.first_byte is not None:
            lease.first_byte()
        try:
            ack = Acker(upstream)
            headers = _response_headers(upstream.headers) + marks
            status = self._status = upstream.status_code
            if status < 400 and self._request.answer_type is not None:
                headers = _with_content_type(headers, self._request.answer_type.encode())
            translator = self._request.translator
            if status < 400 and upstream.headers.get("content-type", "").startswith(
                "text/event-stream"
            ):
                if translator is not None:
                    headers = _with_content_type(headers, translator.content_type)
                return await self._relay_events(upstream, ack, lease, status, headers, send)
            if status < 400 and "content-length" not in upstream.headers and translator is None:
                return await self._relay_chunks(upstream, ack, lease, status, headers, send)
            try:
                async with asyncio.timeout(config.read_timeout):
                    body = await upstream.aread()
            except TimeoutError:
                failure = _timed_out(lease, "mid-way through its answer", config.read_timeout)
                return await self._answer_failure(failure, marks, scope, receive, send)
            except httpx.RequestError as exc:
                failure = _failed(lease, "failed mid-way through its answer", exc)
                return await self._answer_failure(failure, marks, scope, receive, send)
            text = body[:ERROR_TEXT_LIMIT].decode("utf-8", "replace") if status >= 400 else None
            if text is None:
                content_type = upstream.headers.get("content-type", "")
                self._usage = answer_usage(self._request.meter, body, content_type)
            if lease.answered is not None and text is None:
                lease.answered(self._request.body, body)
            if translator is not None:
                status, body = translator.whole(status, body)
                headers = _with_content_type(headers, b"application/json")
            headers.append((b"content-length", b"%d" % len(body)))
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            if text is not None:
                return Outcome.UPSTREAM_ERROR, text
            return Outcome.OK, None
        finally:
            await upstream.aclose()

    def _upstream_request(self, lease: Lease) -> httpx.Request:
        return lease.client.build_request(
            self._request.method,
            lease.base_url + self._request.path,
            content=self._request.body_for(lease.upstream_model),
            headers=self._request.headers,
            timeout=self._config.upstream_timeout,
        )

    async def _answer_failure(
        self,
        failure: RequestRejected,
        marks: list[tuple[bytes, bytes]],
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> tuple[Outcome, str | None]:
        log.warning("%s", failure.message)
        reply = self._request.dialect.reply(failure)
        reply.raw_headers.extend(marks)
        await reply(scope, receive, send)
        return Outcome(failure.code), failure.message

    async def _relay_events(
        self,
        upstream: httpx.Response,
        ack: Acker,
        lease: Lease,
        status: int,
        headers: list[tuple[bytes, bytes]],
        send: Send,
    ) -> tuple[Outcome, str | None]:
        """Pass an event stream on as it comes, whole events only; end it with an error
        event if the runtime dies or stalls, so the client never waits on a dead stream."""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        translator = self._request.translator
        opener = (
            MessageStart(model=self._request.model, request_id=self._request_id)
            if self._request.dialect is ANTHROPIC and translator is None
            else None
        )
        chunks = _body_chunks(upstream)
        held = b""  # the start of an event whose end has not arrived yet
        # The last two whole pieces relayed: where a runtime's final figures are.
        last = (b"", b"")
        failure: RequestRejected | None = None
        silence = Silence(self._config.read_timeout)
        try:
            while True:
                silence.reading()
                try:
                    chunk = await anext(chunks, None)
                except httpx.RequestError as exc:
                    failure = _failed(lease, "failed mid-stream", exc)
                    break
                silence.heard()
                if chunk is None:
                    break
                ack()
                if held:
                    chunk = held + chunk
                end = events_end(chunk)
                held = chunk[end:]
                if end:
                    last = (last[1], chunk[:end])
                    body = chunk[:end] if translator is None else translator.events(chunk[:end])
                    if opener is not None:
                        body = opener.events(body)
                    await send({"type": "http.response.body", "body": body, "more_body": True})
        except asyncio.CancelledError:
            if not silence.timed_out():
                raise
            failure = _timed_out(lease, "mid-stream", self._config.read_timeout)
        finally:
            silence.close()
        if failure is None:
            self._usage = tokens_in(last[0] + last[1] + held)
            if lease.answered is not None:
                lease.answered(self._request.body, last[0] + last[1] + held)
            if translator is not None:
                held = translator.events(held) + translator.end()
            await send({"type": "http.response.body", "body": held})
            return Outcome.OK, None
        log.warning("%s", failure.message)
        body = self._request.dialect.stream_error(failure)
        await send({"type": "http.response.body", "body": body})
        return Outcome(failure.code), failure.message

    async def _relay_chunks(
        self,
        upstream: httpx.Response,
        ack: Acker,
        lease: Lease,
        status: int,
        headers: list[tuple[bytes, bytes]],
        send: Send,
    ) -> tuple[Outcome, str | None]:
        """Pass a body of unknown length on chunk by chunk (a runtime streaming audio)."""
        await send({"type": "http.response.start", "status": status, "headers": headers})
        chunks = _body_chunks(upstream)
        silence = Silence(self._config.read_timeout)
        failure: RequestRejected
        try:
            while True:
                silence.reading()
                chunk = await anext(chunks, None)
                silence.heard()
                if chunk is None:
                    break
                ack()
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.RequestError as exc:
            failure = _failed(lease, "failed mid-body", exc)
            log.warning("%s; dropping the client connection", failure.message)
            raise UpstreamBroken(failure) from exc
        except asyncio.CancelledError as exc:
            if not silence.timed_out():
                raise
            failure = _timed_out(lease, "mid-body", self._config.read_timeout)
            log.warning("%s; dropping the client connection", failure.message)
            raise UpstreamBroken(failure) from exc
        finally:
            silence.close()
        await send({"type": "http.response.body", "body": b""})
        return Outcome.OK, None


def _body_chunks(upstream: httpx.Response) -> Any:
    """The answer's chunks as the client gets them: decoded if the runtime compressed
    them (the proxy drops ``content-encoding``), else as they came off the wire -- one
    generator layer less per chunk, which an event stream pays for every event."""
    encoding = upstream.headers.get("content-encoding", "identity").strip().lower()
    return upstream.aiter_raw() if encoding in ("", "identity") else upstream.aiter_bytes()


def events_end(data: bytes) -> int:
    """The index just past the last complete SSE event in ``data`` (0 if there is none).

    An event ends with a blank line; the SSE spec allows LF, CRLF and CR line endings.
    """
    end = 0
    for terminator in (b"\n\n", b"\r\n\r\n", b"\r\r"):
        found = data.rfind(terminator)
        if found >= 0:
            end = max(end, found + len(terminator))
    return end


def _lease_headers(lease: Lease) -> list[tuple[bytes, bytes]]:
    return [
        (b"x-vramd-service", lease.service.encode()),
        (b"x-vramd-queue-ms", b"%d" % max(0, round(lease.queue_ms))),
        (b"x-vramd-cold-start", b"1" if lease.cold_start else b"0"),
    ]


def _with_content_type(
    headers: list[tuple[bytes, bytes]], content_type: bytes
) -> list[tuple[bytes, bytes]]:
    kept = [(name, value) for name, value in headers if name != b"content-type"]
    return [(b"content-type", content_type), *kept]


def _response_headers(headers: httpx.Headers) -> list[tuple[bytes, bytes]]:
    dropped = _DROPPED_RESPONSE_HEADERS
    if listed := headers.get("connection"):  # it may name more hop-by-hop headers
        dropped = dropped | {name.strip().lower().encode() for name in listed.split(",")}
    return [(name.lower(), value) for name, value in headers.raw if name.lower() not in dropped]


def _failed(lease: Lease, what: str, exc: BaseException) -> RuntimeFailed:
    detail = str(exc) or type(exc).__name__
    return RuntimeFailed(f"the runtime of service {lease.service!r} {what}: {detail}")


def _timed_out(lease: Lease, when: str, seconds: float) -> RuntimeTimeout:
    return RuntimeTimeout(
        f"the runtime of service {lease.service!r} sent nothing for {seconds:g}s {when}"
    )
