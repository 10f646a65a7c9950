"""OpenAI-style error bodies: `{"error": {"message", "type", "param", "code"}}` with a 4xx for client
mistakes. Request validation failures (malformed JSON, wrong types, out-of-range values) become 400
with the offending field's path, as vLLM reports them.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from lumotree.server.protocol import INVALID_UNICODE, TOO_MANY_VALUES, ErrorInfo, ErrorResponse, escaped

log = logging.getLogger("lumotree.server")

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
}


class APIError(Exception):
    """An error reported to the client with an HTTP status and an OpenAI error body."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        # whatever a message quotes from the request (a key, a value) must not make the body unwritable
        message, param = escaped(message), None if param is None else escaped(param)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> ErrorResponse:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=kind, param=self.param, code=self.code)
        )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body().model_dump(), status_code=err.status)


def _validation_error(exc: RequestValidationError) -> APIError:
    errors = exc.errors()
    if not errors:
        return bad_request("invalid request")
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return bad_request(f"the request body is not valid JSON: {first.get('msg', '')}")
    if first.get("type") == INVALID_UNICODE:
        return bad_request(str(first.get("msg")), str(first["ctx"]["field"]))
    if first.get("type") == TOO_MANY_VALUES:
        return APIError(
            413, str(first.get("msg")), param=str(first["ctx"]["field"]), code="request_too_large"
        )
    where = ".".join(loc) or "body"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return bad_request(f"{where}: {first.get('msg', 'invalid value')}{more}", where)


def install_error_handlers(app: FastAPI) -> None:
    """Map APIError, validation errors and Starlette's HTTP errors to OpenAI error bodies."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        err = APIError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body().model_dump(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error")
        return error_response(APIError(500, f"internal server error: {type(exc).__name__}: {exc}"))
