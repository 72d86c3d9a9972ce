"""OpenAI's error JSON, and the one exception every handler raises for a client's mistake.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

`APIError(status, message, param=, code=)` becomes that body with its status (400, 401, 404,
408, 413, 503); the app's handlers turn framework errors (unknown route, wrong method) into the same
shape, so no client ever sees a bare HTML page or a 500 for its own input.
"""

from __future__ import annotations

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}
