"""A small typed HTTP client for the admin API (docs/api.md), used by the CLI.

with AdminClient(settings.url, admin_key=settings.admin_key) as client:
    client.load("chat")          # the service's JSON view once it is ready
"""

from __future__ import annotations

import re
from types import TracebackType
from typing import Any, Self, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from service.contract import (
    ApplyAnswer,
    EventRecord,
    Events,
    Explanation,
    Incident,
    Incidents,
    IncidentSummary,
    SchedulerAnswer,
    ServiceStatus,
    StatusAnswer,
    UsageAnswer,
    Window,
    WindowList,
)

# Loads and restarts answer once the runtime is ready, which can take minutes.
SLOW_TIMEOUT = httpx.Timeout(5.0, read=3600.0)
M = TypeVar("M", bound=BaseModel)
DEFAULT_TIMEOUT = httpx.Timeout(5.0, read=60.0)

# "flagged", "all", "none" or service names; the daemon checks which.
WindowRestart = str | list[str]


class ClientError(Exception):
    """Base of every error the admin client raises."""


class DaemonUnreachable(ClientError):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the vramd daemon at {url} ({reason})")
        self.url = url
        self.reason = reason


class RequestFailed(ClientError):
    pass


class ApiError(ClientError):
    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        errors: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.errors = errors or []


class AdminClient:
    """Blocking client for ``/api``; one method per route the CLI uses."""

    def __init__(
        self,
        url: str,
        *,
        admin_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=DEFAULT_TIMEOUT, transport=transport
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ routes

    def status(self) -> StatusAnswer:
        return self._json(StatusAnswer, "GET", "/api/status")

    def load(self, name: str) -> ServiceStatus:
        path = f"/api/services/{name}/load"
        return self._json(ServiceStatus, "POST", path, timeout=SLOW_TIMEOUT)

    def unload(self, name: str) -> ServiceStatus:
        path = f"/api/services/{name}/unload"
        return self._json(ServiceStatus, "POST", path, timeout=SLOW_TIMEOUT)

    def restart(self, name: str) -> ServiceStatus:
        path = f"/api/services/{name}/restart"
        return self._json(ServiceStatus, "POST", path, timeout=SLOW_TIMEOUT)

    def admission(self, name: str) -> Explanation:
        return self._json(Explanation, "GET", f"/api/services/{name}/admission")

    def scheduler(self) -> SchedulerAnswer:
        return self._json(SchedulerAnswer, "GET", "/api/scheduler")

    def apply_policy(self, text: str, *, dry_run: bool = False) -> ApplyAnswer:
        params = {"dry_run": "true"} if dry_run else {}
        return self._json(
            ApplyAnswer,
            "POST",
            "/api/policy",
            params=params,
            content=text.encode("utf-8"),
            headers={"Content-Type": "application/yaml"},
        )

    def events(
        self,
        *,
        since: int | None = None,
        service: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
    ) -> list[EventRecord]:
        """Events after id ``since``, oldest first."""
        params = {
            key: value
            for key, value in (("since", since), ("service", service), ("kind", kind))
            if value is not None
        }
        if limit is not None:
            params["limit"] = limit
        return self._json(Events, "GET", "/api/events", params=params).events

    def windows(self) -> list[Window]:
        return self._json(WindowList, "GET", "/api/maintenance").windows

    def add_window(
        self,
        *,
        name: str,
        start: str,
        duration: str,
        restart: WindowRestart,
        allow: list[str],
    ) -> Window:
        body = {
            "name": name,
            "start": start,
            "duration": duration,
            "restart": restart,
            "allow": allow,
        }
        return self._json(Window, "POST", "/api/maintenance", json=body)

    def delete_window(self, name: str) -> None:
        self._request("DELETE", f"/api/maintenance/{name}")

    def incidents(self) -> list[IncidentSummary]:
        return self._json(Incidents, "GET", "/api/incidents").incidents

    def incident(self, incident_id: int) -> Incident:
        return self._json(Incident, "GET", f"/api/incidents/{incident_id}")

    def usage(self, *, since: str, client: str | None = None) -> UsageAnswer:
        params = {"since": since} | ({"client": client} if client else {})
        return self._json(UsageAnswer, "GET", "/api/usage", params=params)

    # --------------------------------------------------------------- plumbing

    def _json(self, answer: type[M], method: str, path: str, **kwargs: Any) -> M:
        """The daemon's answer as the API's own type (``service.contract``)."""
        response = self._request(method, path, **kwargs)
        try:
            return answer.model_validate_json(response.content)
        except ValidationError as exc:
            what = "JSON" if _not_json(exc) else f"a {answer.__name__}"
            raise ApiError(
                response.status_code, "bad_response", f"{path} did not answer {what}"
            ) from None

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise DaemonUnreachable(self.url, _reason(exc)) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL):
            raise DaemonUnreachable(self.url, "not an http:// or https:// URL") from None
        except httpx.TimeoutException:
            raise RequestFailed(f"{method} {path}: the daemon did not answer in time") from None
        except httpx.TransportError as exc:
            raise RequestFailed(f"{method} {path}: {_reason(exc)}") from None
        if response.is_error:
            raise api_error(response)
        return response


def _not_json(exc: ValidationError) -> bool:
    return any(error["type"] == "json_invalid" for error in exc.errors())


def api_error(response: httpx.Response) -> ApiError:
    """Read the OpenAI-shaped error body (and ``errors`` of a 422), whatever answered."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code") or error.get("type") or "error")
        message = str(error.get("message") or response.reason_phrase)
    else:
        code, message = "error", f"HTTP {response.status_code} {response.reason_phrase}"
    errors = body.get("errors") if isinstance(body, dict) else None
    return ApiError(
        response.status_code,
        code,
        message,
        errors=[e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else None,
    )


def _reason(exc: Exception) -> str:
    """``[Errno 111] Connection refused`` -> ``connection refused``."""
    text = str(exc) or type(exc).__name__
    text = re.sub(r"^\[Errno -?\d+\]\s*", "", text.strip())
    return text[:1].lower() + text[1:] if text else "no answer"
