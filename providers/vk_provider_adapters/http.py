"""The one request → classify → decode seam of the HTTP adapters (runpod, lambda_cloud,
kubernetes).

``JsonApi`` wraps one ``httpx.AsyncClient`` for one provider: the base URL, the credentials
(sent as headers by an ``httpx.Auth`` whose ``repr`` hides them), the per-request timeout, the
``Redactor`` of that provider's secrets, the adapter's *classify hook* and the ``RetryPolicy``.
What an adapter does with it:

- ``send`` — one request. A 2xx answer (or a status the caller ``accept``\\s) is returned; a
  transport failure (timeout, refused connection, broken TLS) is raised as ``Transient``; any
  other answer goes to the classify hook as an ``ErrorAnswer`` (status, body, headers) and the
  ``domain.errors`` class it returns is raised, ``from`` an ``httpx.HTTPStatusError`` so that a
  retry predicate can still see the status (``answered_status``). ``stream=True`` opens a
  streamed answer (logs) through the same path; ``follow=True`` lifts the read timeout, since a
  followed stream stays quiet for as long as the container does.
- ``request`` / ``retrying`` — the same under the ``RetryPolicy``
  (``vk_provider_adapters.transport``); a call that spans several requests (look up, then create) is
  retried whole with ``retrying``.
- ``decode`` — the JSON of an answer; a body that is not JSON is ``Transient``.
- ``readable`` — around an adapter's parsers: a ``payload.MalformedResponse`` becomes
  ``Transient`` naming the call and what was wrong.
- ``reading`` — around reading a streamed answer: a broken stream becomes ``Transient``.

The httpx *transport* is the test seam: respx routes or an ``httpx.MockTransport`` passed as
``transport`` answer instead of the network.

Invariants:
- Only ``domain.errors`` leave ``send``, ``request``, ``decode``, ``readable`` and ``reading``;
  every message starts with ``<label> <what>:`` (``RunPod create pod for u.0: HTTP 500: ...``).
- Credentials live only in the auth flow's headers; no message, log line or ``repr`` of this
  module's objects carries them. Every text from the server or from httpx passes the
  redactor (every form of every secret: ``domain.redact.secret_forms``) *before* anything may cut
  or collapse it: an error answer's body is redacted whole before its classifier sees it,
  a transport error's text before it enters a message or a chained cause.
- One attempt of ``send`` sends at most one request; a streamed answer that failed is closed
  before its error is raised.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Protocol, TypeVar

import httpx

from vk_provider.sdk import ProviderError, Redactor, Transient
from vk_provider_adapters.payload import MalformedResponse
from vk_provider_adapters.transport import RetryPolicy, log_retries, parse_retry_after

log = logging.getLogger(__name__)

T = TypeVar("T")

# Failures that happen before the request leaves this machine: safe to retry even a create.
NEVER_SENT: Final = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class Answer(Protocol):
    """What a classifier reads of an answer: ``httpx.Response`` and ``ErrorAnswer`` are one."""

    @property
    def status_code(self) -> int: ...

    @property
    def content(self) -> bytes: ...

    @property
    def headers(self) -> httpx.Headers: ...


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """A non-2xx answer as a classify hook sees it (attribute names as ``httpx.Response``'s,
    so a hook can be tested with a plain response). ``redact`` scrubs the provider's secrets
    from any text taken from it."""

    what: str
    status_code: int
    content: bytes = field(repr=False)
    headers: httpx.Headers = field(repr=False)
    redact: Redactor = field(repr=False)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> object | None:
        """The body as JSON; None when it is not JSON."""
        try:
            document: object = json.loads(self.content)
        except ValueError:
            return None
        return document

    def retry_after(self, *, now: datetime | None = None) -> float | None:
        """The answer's ``Retry-After`` in seconds (``transport.parse_retry_after``)."""
        return parse_retry_after(self.headers.get("Retry-After"), now=now)


Classify = Callable[[ErrorAnswer], ProviderError]


def never_sent(error: BaseException) -> bool:
    """Whether ``error`` (raised by ``JsonApi``) failed before its request left this machine."""
    return isinstance(error.__cause__, NEVER_SENT)


def answered_status(error: BaseException) -> int | None:
    """The HTTP status behind an error ``JsonApi`` classified from an answer; None when there
    was no answer (a transport failure) or the error did not come from an answer."""
    cause = error.__cause__
    return cause.response.status_code if isinstance(cause, httpx.HTTPStatusError) else None


def redact_body(body: bytes, redact: Redactor) -> bytes:
    """``body`` with every secret replaced, whatever escapes the server used: a JSON body is
    decoded, every string in it redacted, and encoded again; any other body is redacted as
    text."""
    text = body.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
    except ValueError:
        return redact(text).encode()
    return json.dumps(_redact_json(document, redact), ensure_ascii=False).encode()


def _redact_json(value: object, redact: Redactor) -> object:
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redact_json(item, redact) for item in value]
    if isinstance(value, dict):
        return {redact(str(k)): _redact_json(v, redact) for k, v in value.items()}
    return value


def redact_message(error: BaseException, redact: Redactor) -> None:
    """Scrub ``error``'s message in place (a classifier's message is built from redacted
    text already; this is the last look before it leaves)."""
    message = str(error)
    clean = redact(message)
    if clean != message:
        error.args = (clean,)


def _scrubbed(exc: httpx.HTTPError, redact: Redactor) -> httpx.HTTPError:
    """The cause to chain a transport failure to: ``exc``, or a copy of its type whose message
    is redacted (a traceback of the cause must not carry what the message may not)."""
    message = str(exc)
    clean = redact(message)
    if clean == message:
        return exc
    try:
        return type(exc)(clean)
    except TypeError:  # a subclass with another constructor: keep the kind, not the text
        return httpx.TransportError(clean)


class _HeaderAuth(httpx.Auth):
    """Sets the credential headers on every request; its ``repr`` never shows them."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers.update(self._headers)
        yield request

    def __repr__(self) -> str:
        return f"_HeaderAuth({sorted(self._headers)}: <redacted>)"


class JsonApi:
    """One provider's HTTP API: request, classify, decode (see the module docstring)."""

    def __init__(
        self,
        *,
        provider: str,
        label: str,
        classify: Classify,
        redactor: Redactor,
        retry: RetryPolicy,
        timeout: float,
        base_url: str = "",
        auth_headers: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        logger: logging.Logger = log,
    ) -> None:
        """``label`` starts every message (``RunPod``); ``auth_headers`` carry the credentials;
        ``transport`` is the test seam (None: the network)."""
        self._provider = provider
        self._label = label
        self._classify = classify
        self._redact = redactor
        self._retry = retry
        self._timeout = timeout
        self._log = logger
        self._client = httpx.AsyncClient(
            base_url=base_url,
            transport=transport,
            auth=_HeaderAuth(auth_headers or {}),
            timeout=timeout,
            headers={"Accept": "application/json", **(headers or {})},
        )

    def __repr__(self) -> str:
        return f"JsonApi(provider={self._provider!r}, base_url={str(self._client.base_url)!r})"

    @property
    def redactor(self) -> Redactor:
        return self._redact

    @property
    def retry(self) -> RetryPolicy:
        return self._retry

    async def send(
        self,
        method: str,
        url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        json_body: object = None,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
        accept: frozenset[int] = frozenset(),
        classify: Classify | None = None,
        redact: Redactor | None = None,
        stream: bool = False,
        follow: bool = False,
    ) -> httpx.Response:
        """One request; the answer when it is 2xx or in ``accept``, else its classified error.

        ``json_body`` (when not None) is sent as JSON with ``content_type``; ``classify`` and
        ``redact`` replace the defaults for this request (a create redacts the spec's secret
        env values too); ``stream`` leaves the body unread (the caller closes the answer).
        """
        redact = redact or self._redact
        request_headers = dict(headers or {})
        content: bytes | None = None
        if json_body is not None:
            content = json.dumps(json_body).encode()
            request_headers["Content-Type"] = content_type
        request = self._client.build_request(
            method,
            url,
            params=params,
            content=content,
            headers=request_headers,
            timeout=httpx.Timeout(self._timeout, read=None if follow else self._timeout),
        )
        try:
            response = await self._client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise self.transport_failure(exc, what, redact) from _scrubbed(exc, redact)
        if response.is_success or response.status_code in accept:
            return response
        if stream:
            try:
                with contextlib.suppress(httpx.HTTPError):  # the status alone classifies it
                    await response.aread()
            finally:
                await response.aclose()
        try:
            body = response.content
        except httpx.ResponseNotRead:
            body = b""
        # Redacted whole, before a classifier cuts or collapses any of it.
        answer = ErrorAnswer(
            what, response.status_code, redact_body(body, redact), response.headers, redact
        )
        error = (classify or self._classify)(answer)
        redact_message(error, redact)
        raise error from httpx.HTTPStatusError(
            f"HTTP {response.status_code}", request=request, response=response
        )

    async def request(
        self,
        method: str,
        url: str,
        *,
        what: str,
        retry: Callable[[BaseException], bool] | None = None,
        params: Mapping[str, str] | None = None,
        json_body: object = None,
        content_type: str = "application/json",
        accept: frozenset[int] = frozenset(),
        classify: Classify | None = None,
        redact: Redactor | None = None,
    ) -> httpx.Response:
        """``send`` under the retry policy (``retry`` overrides which errors are retried)."""

        async def attempt() -> httpx.Response:
            return await self.send(
                method,
                url,
                what=what,
                params=params,
                json_body=json_body,
                content_type=content_type,
                accept=accept,
                classify=classify,
                redact=redact,
            )

        return await self.retrying(attempt, retry=retry)

    async def json(
        self,
        method: str,
        url: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        classify: Classify | None = None,
    ) -> object:
        """``request`` and ``decode``: the JSON of a retried request."""
        response = await self.request(method, url, what=what, params=params, classify=classify)
        return self.decode(response, what)

    async def retrying(
        self,
        call: Callable[[], Awaitable[T]],
        *,
        retry: Callable[[BaseException], bool] | None = None,
    ) -> T:
        """``call()`` under the retry policy, each retry logged at INFO."""
        return await self._retry.run(
            call, retry=retry, before_sleep=log_retries(self._log, self._provider)
        )

    def decode(self, response: httpx.Response, what: str) -> object:
        """The JSON of a 2xx answer (None for 204 No Content)."""
        if response.status_code == 204:
            return None
        try:
            return json.loads(response.content)
        except ValueError as exc:
            raise self.malformed(
                what,
                f"body of HTTP {response.status_code} is not JSON ({len(response.content)} "
                f"bytes, truncated?): malformed JSON ({exc})",
            ) from None

    @contextlib.contextmanager
    def readable(self, what: str) -> Iterator[None]:
        """An answer the adapter's parsers cannot read is a ``Transient`` naming what was
        wrong."""
        try:
            yield
        except MalformedResponse as exc:
            raise self.malformed(what, str(exc)) from None

    @contextlib.contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """A streamed answer that breaks while it is read is ``Transient``."""
        try:
            yield
        except httpx.HTTPError as exc:
            raise Transient(
                f"{self._label} {what}: the stream broke ({type(exc).__name__})",
                provider=self._provider,
            ) from exc

    async def lines(self, response: httpx.Response, what: str) -> AsyncIterator[str]:
        """The lines of a streamed answer (``reading`` applies)."""
        stream = response.aiter_lines()
        while True:
            with self.reading(what):
                try:
                    line = await anext(stream)
                except StopAsyncIteration:
                    return
            yield line

    def malformed(self, what: str, detail: str) -> Transient:
        return Transient(
            f"{self._label} {what}: malformed response: {self._redact(detail)}",
            provider=self._provider,
        )

    def transport_failure(self, exc: httpx.HTTPError, what: str, redact: Redactor) -> Transient:
        """The ``Transient`` of a request that got no answer."""
        name = type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            reason = f"timed out after {self._timeout:g}s ({name})"
        else:
            reason = f"{name}: {redact(str(exc)) or 'no detail'}"
        return Transient(f"{self._label} {what}: {reason}", provider=self._provider)

    async def aclose(self) -> None:
        await self._client.aclose()
