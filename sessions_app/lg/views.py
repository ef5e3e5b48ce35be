"""The LangGraph-server-compatible door, mounted at /lg/ (docs/langgraph.md).

Thin: authenticate (x-api-key or Bearer: the API's tokens), parse the JSON
body (unknown fields are ignored, as LangGraph's server does), call
lg/ops.py, render. Errors carry the API's `code` and `message` (and
`detail`, which LangGraph clients print). CORS answers origins listed in
TERRET_LG_CORS_ORIGINS. JSON views are synchronous; the streaming and
waiting views are async, with their database work in threads.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from sessions_app.errors import (
    InvalidInput,
    InvalidJson,
    PathNotFound,
    PayloadTooLarge,
    TerretError,
    Unauthenticated,
    as_error,
)
from sessions_app.lg import ops, stream
from sessions_app.services.tokens import authenticate_token

logger = logging.getLogger(__name__)

JOIN_MAX_SECONDS = 290.0  # below the SDK's 300 s read timeout
ALLOWED_HEADERS = "authorization, x-api-key, content-type, last-event-id, cache-control, accept, x-request-id"
EXPOSED_HEADERS = "Content-Location, Location"

Handler = Callable[..., Any]


# ---------------------------------------------------------------- plumbing


def _cors[R: HttpResponseBase](request: HttpRequest, response: R) -> R:
    origin = request.headers.get("Origin")
    allowed = settings.TERRET_LG_CORS_ORIGINS
    if origin and ("*" in allowed or origin in allowed):
        response["Access-Control-Allow-Origin"] = origin
        response["Access-Control-Expose-Headers"] = EXPOSED_HEADERS
        response["Vary"] = "Origin"
    return response


def _preflight(request: HttpRequest) -> HttpResponse:
    response = HttpResponse(status=204)
    if _cors(request, response).has_header("Access-Control-Allow-Origin"):
        response["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
        response["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
        response["Access-Control-Max-Age"] = "600"
    return response


def error_response(request: HttpRequest, exc: BaseException) -> HttpResponse:
    error = as_error(exc)
    if error.status >= 500:
        logger.error("LangGraph door %s %s failed", request.method, request.path, exc_info=exc)
    message = str(error) or error.code.replace("_", " ")
    body = {"code": error.code, "message": message, "detail": message}
    return _cors(request, JsonResponse(body, status=error.status))


def user_of(request: HttpRequest) -> Any:
    """The token's user: `x-api-key: <token>` (what the SDKs send) or
    `Authorization: Bearer <token>`. Cookies are not accepted here."""
    raw = request.headers.get("x-api-key")
    if raw is None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        raw = token.strip() if scheme.lower() == "bearer" else None
    if not raw:
        raise Unauthenticated("send x-api-key: <token> or Authorization: Bearer <token>")
    found = authenticate_token(raw.strip())
    if found is None:
        raise Unauthenticated("the token is invalid or revoked")
    # Streams, joins and waits re-check it while they last (stream.token_live).
    request.lg_token_id = found.pk  # type: ignore[attr-defined]
    return found.user


def token_id_of(request: HttpRequest) -> int | None:
    return getattr(request, "lg_token_id", None)


def body_of(request: HttpRequest) -> dict[str, Any]:
    if request.method != "POST":
        return {}
    try:
        raw = request.body
    except RequestDataTooBig:
        raise PayloadTooLarge("the request body is too large") from None
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):
        raise InvalidJson("the request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidInput("the request body must be a JSON object")
    return data


def _json(data: Any, status: int = 200) -> JsonResponse:
    return JsonResponse(data, status=status, safe=False)


def json_view(methods: tuple[str, ...]) -> Callable[[Handler], Callable[..., HttpResponse]]:
    def wrap(handler: Handler) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @functools.wraps(handler)
        def view(request: HttpRequest, **kwargs: Any) -> HttpResponse:
            if request.method == "OPTIONS":
                return _preflight(request)
            if request.method not in methods:
                return error_response(request, PathNotFound(f"no {request.method} {request.path[:200]}"))
            try:
                response = handler(request, user_of(request), body_of(request), **kwargs)
            except Exception as exc:
                return error_response(request, exc)
            return _cors(request, response if isinstance(response, HttpResponse) else _json(response))

        return view

    return wrap


def async_view(methods: tuple[str, ...]) -> Callable[[Handler], Callable[..., Any]]:
    def wrap(handler: Handler) -> Callable[..., Any]:
        @csrf_exempt
        @functools.wraps(handler)
        async def view(request: HttpRequest, **kwargs: Any) -> HttpResponseBase:
            if request.method == "OPTIONS":
                return _preflight(request)
            if request.method not in methods:
                return error_response(request, PathNotFound(f"no {request.method} {request.path[:200]}"))
            try:
                user = await _db(user_of)(request)
                body = await _db(body_of)(request)
                response = await handler(request, user, body, **kwargs)
            except Exception as exc:
                return error_response(request, exc)
            return _cors(request, response)

        return view

    return wrap


def _db(fn: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    return database_sync_to_async(fn, thread_sensitive=False, executor=stream.POOL)  # type: ignore[no-any-return]


def run_paths(thread_id: str, run_id: str, modes: tuple[str, ...]) -> dict[str, str]:
    """Content-Location (the run) and Location (its stream, with the modes, so
    the SDK's reconnect asks for what the first request asked for). Relative
    to the door, as LangGraph's server sends them: both SDKs join them onto
    their base URL, which ends in /lg."""
    base = f"/threads/{thread_id}/runs/{run_id}"
    query = urlencode([("stream_mode", m) for m in modes])
    return {"Content-Location": base, "Location": f"{base}/stream" + (f"?{query}" if query else "")}


def _sse_response(request: HttpRequest, plan: stream.Plan) -> StreamingHttpResponse:
    response = StreamingHttpResponse(stream.guarded(stream.RunStream(plan)), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    for name, value in run_paths(str(plan.session_id), plan.run_id, plan.modes).items():
        response[name] = value
    return response


def _on_disconnect_cancel(user: Any, started: ops.Started) -> None:
    """on_disconnect=cancel: the client went away before the run ended."""
    try:
        if not ops.run_ended(started.session_id, started.run_id):
            ops.cancel_turn(user, started.session_id)
    except TerretError:
        pass  # it ended meanwhile, or the caller lost access: nothing to cancel


# ---------------------------------------------------------------- JSON views


@json_view(("GET",))
def info(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    return {
        "version": "terret-lg-1",
        "langgraph_py_version": None,
        "flags": {"assistants": True, "crons": False, "langsmith": False, "strict_resume": False},
        "host": {"kind": "terret"},
    }


@json_view(("POST",))
def assistants_search(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    return ops.search_assistants(user, body)


@json_view(("GET",))
def assistant_detail(request: HttpRequest, user: Any, body: dict[str, Any], assistant_id: str) -> Any:
    return ops.get_assistant(user, assistant_id)


@json_view(("POST",))
def threads_create(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    return ops.create_thread(user, body)


@json_view(("POST",))
def threads_search(request: HttpRequest, user: Any, body: dict[str, Any]) -> Any:
    return ops.search_threads(user, body)


@json_view(("GET",))
def thread_detail(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> Any:
    return ops.get_thread(user, thread_id)


@json_view(("GET",))
def thread_state(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> Any:
    return ops.state(user, thread_id)


@json_view(("GET",))
def thread_state_at(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str, checkpoint: str) -> Any:
    return ops.state(user, thread_id, checkpoint)


@json_view(("GET", "POST"))
def thread_history(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> Any:
    if request.method == "GET":
        body = {"limit": _query_int(request, "limit", ops.HISTORY_LIMIT)}
    return ops.history(user, thread_id, body)


def _query_int(request: HttpRequest, name: str, default: int) -> int:
    raw = request.GET.get(name)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 9:
        raise InvalidInput(f"{name} must be a whole number")
    return int(raw)


@json_view(("GET", "POST"))
def runs(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> Any:
    """GET: the thread's runs, newest first. POST: a background run."""
    if request.method == "GET":
        limit, offset = _query_int(request, "limit", 10), _query_int(request, "offset", 0)
        status = request.GET.get("status") or None
        return ops.list_runs(user, thread_id, max(1, min(limit, ops.MAX_PAGE)), offset, status)
    started = ops.start_run(user, thread_id, body)
    record = ops.get_run(user, started.session_id, started.run_id)
    response = _json(record)
    modes = stream.parse_modes(body.get("stream_mode"))
    for name, value in run_paths(str(started.session_id), started.run_id, modes).items():
        response[name] = value
    return response


@json_view(("GET",))
def run_detail(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str, run_id: str) -> Any:
    return ops.get_run(user, thread_id, run_id)


# ---------------------------------------------------------------- streams and waits


@async_view(("POST",))
async def runs_stream(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> HttpResponseBase:
    modes = stream.parse_modes(body.get("stream_mode"))
    started = await _db(ops.start_run)(user, thread_id, body)
    plan = stream.Plan(started.session_id, started.run_id, started.open_seq, modes, None, user, token_id_of(request))
    response = _sse_response(request, plan)
    if body.get("on_disconnect") == "cancel":
        response.streaming_content = _cancel_on_close(response.streaming_content, user, started)  # type: ignore[assignment]
    return response


async def _cancel_on_close(content: Any, user: Any, started: ops.Started) -> Any:
    finished = False
    try:
        async for chunk in content:
            yield chunk
        finished = True
    finally:
        if not finished:
            await _db(_on_disconnect_cancel)(user, started)


@async_view(("GET",))
async def run_stream(
    request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str, run_id: str
) -> HttpResponseBase:
    modes = stream.parse_modes(request.GET.getlist("stream_mode") or None)
    resume = stream.parse_last_event_id(request.headers.get("Last-Event-ID"))
    record = await _db(ops.get_run)(user, thread_id, run_id)
    open_seq = int(record["metadata"]["open_seq"])
    plan = stream.Plan(ops.parse_thread(thread_id), run_id, open_seq, modes, resume, user, token_id_of(request))
    return _sse_response(request, plan)


async def _wait_ended(request: HttpRequest, user: Any, thread_id: Any, run_id: str) -> None:
    """Until the run ends (at most JOIN_MAX_SECONDS): followed as a stream
    follows it (stream.wait_for_end: pushed by the hub, the token re-checked),
    after one read of the run."""
    record = await _db(ops.get_run)(user, thread_id, run_id)
    if record["status"] not in ("pending", "running"):
        return
    open_seq = int(record["metadata"]["open_seq"])
    plan = stream.Plan(ops.parse_thread(thread_id), run_id, open_seq, (), None, user, token_id_of(request))
    await stream.wait_for_end(plan, JOIN_MAX_SECONDS)


@async_view(("GET",))
async def run_join(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str, run_id: str) -> HttpResponse:
    await _wait_ended(request, user, thread_id, run_id)
    return _json(await _db(ops.values_of)(user, thread_id))


@async_view(("POST",))
async def runs_wait(request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str) -> HttpResponse:
    started = await _db(ops.start_run)(user, thread_id, body)
    await _wait_ended(request, user, started.session_id, started.run_id)
    response = _json(await _db(ops.values_of)(user, started.session_id))
    response["Content-Location"] = run_paths(str(started.session_id), started.run_id, ())["Content-Location"]
    return response


@async_view(("POST",))
async def run_cancel(
    request: HttpRequest, user: Any, body: dict[str, Any], thread_id: str, run_id: str
) -> HttpResponseBase:
    """Cancel the run's turn (or withdraw its input, while pending); with
    wait=1, answer once the run has ended."""
    record = await _db(ops.cancel_run)(user, thread_id, run_id, request.GET.get("action", "interrupt"))
    if request.GET.get("wait") in ("1", "true"):
        await _wait_ended(request, user, thread_id, run_id)
        record = await _db(ops.get_run)(user, thread_id, run_id)
    return _json(record)


@csrf_exempt
def not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    if request.method == "OPTIONS":
        return _preflight(request)
    return error_response(request, PathNotFound(f"no LangGraph path {request.path[:200]}"))
