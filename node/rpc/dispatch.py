"""JSON-RPC 2.0: the method registry and the dispatcher (no I/O; the HTTP layer is in `app`).

Services add methods to the node's `RpcRegistry`::

    async def status(*, verbose: bool = False) -> dict: ...
    node.rpc.register("run.status", status)

A method is an async function taking keyword (or positional) parameters and
returning something `json.dumps` can write; a float that is NaN or infinite
goes out as ``null`` (JSON has no such numbers). A result JSON cannot hold
at all is the method's bug: ``internal error`` (-32603) naming the method,
logged once per method. Parameters from the request are
bound to the function's signature *before* it is called: a missing, extra or
misnamed parameter is an ``invalid params`` error (-32602) and the function
never runs. A method checks the values' types itself and raises
`RpcError.invalid_params(...)` for a bad one; any other `RpcError` it raises
goes to the client as is. Any other exception is a bug: it is logged with its
traceback and the client gets ``internal error`` (-32603) without details.

`RpcDispatcher.handle(body)` takes one HTTP request body and returns the
response body, or None when every call in it was a notification (no ``id``),
following the specification: parse error -32700, invalid request -32600,
method not found -32601. Batches (a JSON array) are answered in one array and
are limited to `MAX_BATCH` calls.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

MAX_BATCH = 64
_MAX_NAME = 128
_MAX_DEPTH = 64

Method = Callable[..., Awaitable[Any]]


class RpcError(Exception):
    """An error to send back to the client as a JSON-RPC error object."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    @classmethod
    def invalid_params(cls, message: str) -> RpcError:
        return cls(INVALID_PARAMS, f"invalid params: {message}")

    def to_json(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@dataclass(frozen=True)
class _Entry:
    function: Method
    signature: inspect.Signature


class RpcRegistry:
    """Named RPC methods. Names are dotted, one prefix per service (``node.``, ``run.``)."""

    def __init__(self) -> None:
        self._methods: dict[str, _Entry] = {}

    def register(self, name: str, function: Method) -> None:
        if not name or len(name) > _MAX_NAME or name.startswith("rpc."):
            raise ValueError(f"{name!r} is not an allowed method name")
        if name in self._methods:
            raise ValueError(f"RPC method {name!r} is registered twice")
        if not inspect.iscoroutinefunction(function):
            raise TypeError(f"RPC method {name!r} must be an async function")
        self._methods[name] = _Entry(function, inspect.signature(function))

    def names(self) -> list[str]:
        return sorted(self._methods)

    def __contains__(self, name: object) -> bool:
        return name in self._methods

    async def call(self, name: str, params: list | dict | None) -> Any:
        """Run one method; raise `RpcError` for an unknown method or parameters that do not bind."""
        entry = self._methods.get(name)
        if entry is None:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {name[:_MAX_NAME]}")
        args, kwargs = ([], params) if isinstance(params, dict) else (params or [], {})
        try:
            entry.signature.bind(*args, **kwargs)
        except TypeError as error:
            raise RpcError.invalid_params(str(error)) from None
        return await entry.function(*args, **kwargs)


class RegistryView:
    """The methods of `registry` named in `allowed`, and no others: what a caller with fewer rights
    (the dashboard's browser session) may call. To it, any other name does not exist."""

    def __init__(self, registry: RpcRegistry, allowed: frozenset[str]) -> None:
        self._registry = registry
        self._allowed = allowed

    def __contains__(self, name: object) -> bool:
        return name in self._allowed and name in self._registry

    async def call(self, name: str, params: list | dict | None) -> Any:
        """As `RpcRegistry.call`; a name outside `allowed` is METHOD_NOT_FOUND."""
        if name not in self._allowed:
            raise RpcError(METHOD_NOT_FOUND, f"method not found: {name[:_MAX_NAME]}")
        return await self._registry.call(name, params)


class RpcDispatcher:
    """Turns request bodies into response bodies, calling methods of `registry`.

    `on_call(method)` is told about every call whose method exists (for the
    request counter); its argument is a registered name, never client text.
    """

    def __init__(self, registry: RpcRegistry | RegistryView, on_call: Callable[[str], None] | None = None) -> None:
        self.registry = registry
        self._on_call = on_call
        self._unencodable: set[str] = set()  # methods whose unencodable result was logged

    async def handle(self, body: bytes) -> bytes | None:
        try:
            request = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            return _dump(_error_response(None, RpcError(PARSE_ERROR, "parse error: body is not JSON")))
        if isinstance(request, list):
            return await self._handle_batch(request)
        response = await self._handle_one(request)
        return None if response is None else _dump(response)

    async def _handle_batch(self, requests: list) -> bytes | None:
        if not requests:
            return _dump(_error_response(None, RpcError(INVALID_REQUEST, "invalid request: empty batch")))
        if len(requests) > MAX_BATCH:
            error = RpcError(INVALID_REQUEST, f"invalid request: a batch holds at most {MAX_BATCH} calls")
            return _dump(_error_response(None, error))
        responses = [response for request in requests if (response := await self._handle_one(request)) is not None]
        return _dump(responses) if responses else None

    async def _handle_one(self, request: Any) -> dict[str, Any] | None:
        """The response object for one call, or None for a valid notification."""
        try:
            request_id, method, params = _check_request(request)
        except RpcError as error:
            return _error_response(_id_if_valid(request), error)
        try:
            if method in self.registry and self._on_call is not None:
                self._on_call(method)
            result = self._encodable(method, await self.registry.call(method, params))
        except RpcError as error:
            response = _error_response(request_id, error)
        except Exception:  # a bug in a method must not kill the server
            logger.exception("RPC method %s failed", method)
            response = _error_response(request_id, RpcError(INTERNAL_ERROR, "internal error"))
        else:
            response = {"jsonrpc": "2.0", "id": request_id, "result": result}
        return None if request_id is _NOTIFICATION else response

    def _encodable(self, method: str, result: Any) -> Any:
        """`result` as JSON can hold it: NaN and infinities become null (a loss that diverged is a
        value, not a bug). Anything else JSON cannot hold is the method's bug: an `RpcError`
        INTERNAL_ERROR that names the method, logged once per method."""
        try:
            return _finite(result)
        except (TypeError, ValueError, RecursionError) as error:
            if method not in self._unencodable:
                self._unencodable.add(method)
                logger.error("RPC method %s returned a result JSON cannot hold: %s", method, error)
            message = f"internal error: the result of {method} cannot be written as JSON"
            raise RpcError(INTERNAL_ERROR, message) from None


_NOTIFICATION = object()


def _check_request(request: Any) -> tuple[Any, str, list | dict | None]:
    if not isinstance(request, dict):
        raise RpcError(INVALID_REQUEST, "invalid request: a call is a JSON object")
    if request.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'invalid request: "jsonrpc" must be "2.0"')
    unknown = request.keys() - {"jsonrpc", "id", "method", "params"}
    if unknown:
        raise RpcError(INVALID_REQUEST, f"invalid request: unknown member {sorted(unknown)[0][:64]!r}")
    method = request.get("method")
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, 'invalid request: "method" must be a string')
    params = request.get("params")
    if "params" in request and not isinstance(params, (list, dict)):
        raise RpcError(INVALID_REQUEST, 'invalid request: "params" must be an array or an object')
    if "id" not in request:
        return _NOTIFICATION, method, params
    if not _valid_id(request["id"]):
        raise RpcError(INVALID_REQUEST, 'invalid request: "id" must be a string, a number or null')
    return request["id"], method, params


def _valid_id(value: Any) -> bool:
    return value is None or (isinstance(value, (str, int, float)) and not isinstance(value, bool))


def _id_if_valid(request: Any) -> Any:
    if isinstance(request, dict) and _valid_id(request.get("id")):
        return request.get("id")
    return None


def _error_response(request_id: Any, error: RpcError) -> dict[str, Any]:
    if request_id is _NOTIFICATION:
        request_id = None
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_json()}


def _dump(response: Any) -> bytes:
    return json.dumps(response, separators=(",", ":"), allow_nan=False).encode("utf-8")


def _finite(value: Any) -> Any:
    """`value` with every non-finite float replaced by None; `TypeError` / `ValueError` if JSON
    cannot hold it even so. The common case, a result with no such float, costs one encoding."""
    try:
        _dump(value)
        return value
    except ValueError:  # NaN or an infinity somewhere (or a circular reference: raised again below)
        pass
    cleaned = _without_non_finite(value)
    _dump(cleaned)
    return cleaned


def _without_non_finite(value: Any, depth: int = 0) -> Any:
    if depth > _MAX_DEPTH:
        raise ValueError(f"a result nested over {_MAX_DEPTH} levels")
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _without_non_finite(item, depth + 1) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_non_finite(item, depth + 1) for item in value]
    return value
