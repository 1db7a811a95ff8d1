"""Errors in OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: the
:class:`APIError` routes raise, and the app's handlers for every other exception (validation,
bad input, a dead engine, HTTP errors, anything unexpected)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from spectool.errors import BadInputError
from spectool.server.driver import EngineDeadError
from spectool.server.schemas import ErrorInfo, ErrorResponse

logger = logging.getLogger("spectool.server")


class APIError(Exception):
    """An HTTP error answered in OpenAI's shape (status, type, message, param, code)."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type_
        self.param = param
        self.code = code


def error_response(
    status_code: int,
    message: str,
    *,
    type_: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    body = ErrorResponse(error=ErrorInfo(message=message, type=type_, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status_code)


def _validation_message(error: dict[str, Any]) -> tuple[str, str | None]:
    """One readable line and the offending top-level parameter for a validation error."""
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    path = ".".join(loc)
    param = loc[0] if loc else None
    kind = error.get("type", "")
    if kind == "json_invalid":
        detail = (error.get("ctx") or {}).get("error", "")
        return f"request body is not valid JSON{': ' + str(detail) if detail else ''}", None
    if kind == "extra_forbidden":
        return f"unsupported parameter '{path}'", param
    if kind == "missing":
        return f"missing required parameter '{path}'", param
    message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
    return (f"{path}: {message}" if path else message), param


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestValidationError)
    async def _on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        message, param = _validation_message(errors[0]) if errors else ("invalid request", None)
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problems)"
        return error_response(400, message, param=param)

    @app.exception_handler(BadInputError)
    async def _on_bad_input(request: Request, exc: BadInputError) -> JSONResponse:
        return error_response(400, str(exc), param=exc.where)

    @app.exception_handler(APIError)
    async def _on_api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(
            exc.status_code, exc.message, type_=exc.type, param=exc.param, code=exc.code
        )

    @app.exception_handler(EngineDeadError)
    async def _on_engine_dead(request: Request, exc: EngineDeadError) -> JSONResponse:
        return error_response(503, str(exc), type_="service_unavailable")

    @app.exception_handler(StarletteHTTPException)
    async def _on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("unexpected error on %s", request.url.path)
        return error_response(500, "internal server error", type_="server_error")
