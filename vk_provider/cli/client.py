"""The operator's side of the REST API: fetching JSON from a running agent (tables: ``tables``).

``RestClient`` makes the HTTP calls of ``vk-provider providers | offers | pods | spend | place
| overflow`` and translates every failure, once, into a ``RestClientError`` whose message is
one line an operator can act on (unreachable, token refused, any other HTTP error).

Invariants:
- The token travels only in the ``Authorization`` header; it is never part of a message.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

JSONObject = dict[str, Any]
DEFAULT_URL = "http://127.0.0.1:8080"
DEFAULT_TIMEOUT_SECONDS = 10.0


class OutputFormat(enum.StrEnum):
    TABLE = "table"
    WIDE = "wide"  # more columns, where a command has them
    JSON = "json"


class RestClientError(Exception):
    """The query failed; the message is one line for the operator."""


class ApiUnreachable(RestClientError):
    """No HTTP answer at all: wrong URL, agent down, network."""


class TokenRefused(RestClientError):
    """The API answered 401."""


class ApiFailed(RestClientError):
    """The API answered with another error, or with something that is not its JSON."""


def check_token(token: str) -> str:
    """``token`` if it can be a bearer token (printable ASCII, no spaces); else ``ValueError``.

    The message never repeats the token.
    """
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError("is not a bearer token (empty, or has spaces or non-ASCII characters)")
    return token


def read_token_file(path: Path) -> str:
    """The token in ``path`` (surrounding whitespace removed); ``ValueError`` names the problem."""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ValueError(f"cannot read {path} ({exc.strerror})") from exc
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file") from None
    if not token:
        raise ValueError(f"{path} is empty")
    try:
        return check_token(token)
    except ValueError as exc:
        raise ValueError(f"{path} {exc}") from None


class RestClient:
    """Synchronous client of one agent's REST API (the CLI is synchronous)."""

    def __init__(
        self,
        url: str,
        *,
        token: str | None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url
        self._has_token = bool(token)
        self._timeout = timeout
        headers = {"Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RestClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def providers(self) -> list[JSONObject]:
        return self._get_list("/v1/providers")

    def offers(
        self,
        *,
        gpu: str | None = None,
        region: str | None = None,
        provider: str | None = None,
        capacity_type: str = "any",
    ) -> list[JSONObject]:
        params = {"capacity_type": capacity_type}
        for name, value in (("gpu", gpu), ("region", region), ("provider", provider)):
            if value:
                params[name] = value
        return self._get_list("/v1/offers", params)

    def gpus(
        self,
        *,
        gpu: str | None = None,
        region: str | None = None,
        provider: str | None = None,
        capacity_type: str = "any",
        limit: int = 0,
    ) -> JSONObject:
        params = {"capacity_type": capacity_type, "limit": str(limit)}
        for name, value in (("gpu", gpu), ("region", region), ("provider", provider)):
            if value:
                params[name] = value
        return self._object(self._get("/v1/gpus", params), "/v1/gpus")

    def pods(self) -> list[JSONObject]:
        return self._get_list("/v1/pods")

    def spend(self) -> JSONObject:
        return self._object(self._get("/v1/spend"), "/v1/spend")

    def overflow(self) -> JSONObject:
        return self._object(self._get("/v1/overflow"), "/v1/overflow")

    def place(self, pod: Mapping[str, Any]) -> JSONObject:
        """The placement dry run of ``pod`` (``POST /v1/placements``)."""
        return self._object(self._request("POST", "/v1/placements", json=pod), "/v1/placements")

    def _object(self, data: Any, path: str) -> JSONObject:
        if not isinstance(data, dict):
            raise ApiFailed(
                f"the vk-provider REST API at {self.url} answered {path} with unexpected JSON "
                "(not an object)"
            )
        return data

    def _get_list(self, path: str, params: Mapping[str, str] | None = None) -> list[JSONObject]:
        data = self._get(path, params)
        if not isinstance(data, list) or not all(isinstance(item, dict) for item in data):
            raise ApiFailed(
                f"the vk-provider REST API at {self.url} answered {path} with unexpected JSON "
                "(not a list)"
            )
        return data

    def _get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        return self._request("GET", path, params=params)

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        json: Any = None,
    ) -> Any:
        where = f"the vk-provider REST API at {self.url}"
        try:
            response = self._http.request(method, path, params=params, json=json)
        except httpx.TimeoutException as exc:
            raise ApiUnreachable(
                f"cannot reach {where}: no answer within {self._timeout:g}s"
            ) from exc
        except httpx.HTTPError as exc:
            reason = str(exc) or type(exc).__name__
            raise ApiUnreachable(f"cannot reach {where}: {reason}") from exc
        if response.status_code == 401:
            if not self._has_token:
                raise TokenRefused(
                    f"{where} needs a token: pass --token or --token-file, or set VK_PROVIDER_TOKEN"
                )
            raise TokenRefused(f"the token was refused by {where}")
        if response.is_error:
            raise ApiFailed(
                f"{where} answered {response.status_code} for {path}: {_error_message(response)}"
            )
        try:
            return response.json()
        except ValueError:
            raise ApiFailed(f"{where} answered {path} with something that is not JSON") from None


def _error_message(response: httpx.Response) -> str:
    """The message of the API's JSON error body, or the HTTP reason if there is none."""
    try:
        body = response.json()
        message = body["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return response.reason_phrase or "error"
    return str(message)
