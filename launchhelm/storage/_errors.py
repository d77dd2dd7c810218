"""What went wrong with a storage request, in words a user can act on.

s3fs, gcsfs and adlfs each raise their own exceptions (botocore's
``ClientError`` translated to built-ins, gcsfs's ``HttpError``, azure-core's
``HttpResponseError``, aiohttp's connection errors...). :func:`classify`
sorts any of them into the few cases LaunchHelm treats differently, by
looking at the exception chain's types, status codes and error codes, without
importing any backend library (``import launchhelm`` stays light).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

__all__ = ["Problem", "classify", "no_answer"]

#: Kinds of problem, most specific first.
EXISTS = "exists"  # put-if-absent lost: the object is there
MISSING = "missing"  # the object is not there
NO_BUCKET = "no_bucket"  # the bucket / container is not there
DENIED = "denied"  # credentials refused or not allowed
UNREACHABLE = "unreachable"  # no connection to the endpoint
TRANSIENT = "transient"  # worth another try: 5xx, 429, 409 conflict, a reset mid-transfer
OTHER = "other"

_CONNECT_NAMES = {
    "ConnectionRefusedError",
    "ClientConnectorError",
    "ClientConnectorDNSError",
    "EndpointConnectionError",
    "ConnectTimeoutError",
    "ConnectTimeout",
    "ServiceRequestError",  # azure-core: the request never got an answer
    "gaierror",
    "NewConnectionError",
}
_RESET_NAMES = {
    "ConnectionResetError",
    "BrokenPipeError",
    "ServerDisconnectedError",
    "ClientOSError",
    "ClientPayloadError",
    "ReadTimeoutError",
    "ServerTimeoutError",
    "IncompleteRead",
    "ResponseStreamingError",
    "ServiceResponseError",  # azure-core: the answer broke off
    "FSTimeoutError",
    "TimeoutError",
    "ProtocolError",
}
_DENIED_CODES = {
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "ExpiredToken",
    "InvalidToken",
    "AuthenticationFailed",
    "AuthorizationFailure",
    "AuthorizationPermissionMismatch",
    "InsufficientAccountPermissions",
}
_NO_BUCKET_CODES = {"NoSuchBucket", "ContainerNotFound", "ContainerBeingDeleted"}
_NO_BUCKET_TEXT = ("The specified bucket does not exist", "The specified container does not exist", "NoSuchBucket")
_TRANSIENT_CODES = {
    "ConditionalRequestConflict",
    "SlowDown",
    "ServiceUnavailable",
    "InternalError",
    "RequestTimeout",
    "ServerBusy",
    "OperationTimedOut",
    "RequestTimeTooSkewed",
}
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class Problem:
    """One failed request, sorted: ``kind`` and a short ``detail`` for messages."""

    kind: str
    detail: str
    status: int | None = None
    code: str | None = None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 8:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    status: object = None
    code: object = None
    response = getattr(exc, "response", None)
    if isinstance(response, dict):  # botocore ClientError
        error = response.get("Error") or {}
        code = error.get("Code")
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    if status is None:
        status = getattr(exc, "status_code", None)  # azure-core
    if code is None:
        code = getattr(exc, "error_code", None)  # azure-core
    if status is None:
        raw = getattr(exc, "code", None)  # gcsfs HttpError
        if isinstance(raw, int) and raw >= 100:
            status = raw
    if status is None:
        raw = getattr(exc, "status", None)  # aiohttp ClientResponseError
        if isinstance(raw, int) and raw >= 100:
            status = raw
    code_text = str(code) if code is not None and not isinstance(code, int) else None
    if code_text is not None and "." in code_text:  # azure's StorageErrorCode enum repr
        code_text = code_text.rsplit(".", 1)[-1]
    return (int(status) if isinstance(status, int) else None), code_text


def classify(exc: BaseException) -> Problem:
    """Sort a backend exception (and its causes) into one :class:`Problem` kind."""
    links = _chain(exc)
    names = {base.__name__ for e in links for base in type(e).__mro__}
    status: int | None = None
    code: str | None = None
    for link in links:
        s, c = _status_and_code(link)
        status = status if status is not None else s
        code = code if code is not None else c
    text = " ".join(str(e) for e in links)
    detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}"[:300]

    def problem(kind: str) -> Problem:
        return Problem(kind, detail, status, code)

    if isinstance(exc, FileExistsError) or status == 412 or code in ("PreconditionFailed", "BlobAlreadyExists"):
        return problem(EXISTS)
    if code in _NO_BUCKET_CODES or any(t in text for t in _NO_BUCKET_TEXT):
        return problem(NO_BUCKET)
    if (
        code in _DENIED_CODES
        or status in (401, 403)
        or isinstance(exc, PermissionError)
        or "ClientAuthenticationError" in names
        or text.startswith("Forbidden")
    ):
        return problem(DENIED)
    if code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS:
        return problem(TRANSIENT)
    if status == 409 and code in (None, "ConditionalRequestConflict", "OperationAborted"):
        return problem(TRANSIENT)
    if names & _CONNECT_NAMES or any(
        isinstance(e, OSError) and e.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH) for e in links
    ):
        return problem(UNREACHABLE)
    if names & _RESET_NAMES or any(isinstance(e, (ConnectionError, TimeoutError)) for e in links):
        return problem(TRANSIENT)
    if isinstance(exc, FileNotFoundError) or status == 404 or code in ("NoSuchKey", "BlobNotFound", "NoSuchUpload"):
        return problem(MISSING)
    if isinstance(exc, OSError) and exc.errno == errno.EBUSY:
        return problem(TRANSIENT)
    return problem(OTHER)


_TIMEOUT_NAMES = {
    "ReadTimeoutError",
    "ConnectTimeoutError",
    "ConnectTimeout",
    "ServerTimeoutError",
    "SocketTimeoutError",
    "ConnectionTimeoutError",
    "FSTimeoutError",
    "TimeoutError",
    "timeout",
}


def no_answer(exc: BaseException) -> bool:
    """True if ``exc`` is a request that timed out: no connection, or no answer, within the timeouts.

    The client library has tried such a request several times (``_backends.CLIENT_ATTEMPTS``), each
    waiting the whole timeout; trying it again would only make a dead store hang its caller longer.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if any(t.__name__ in _TIMEOUT_NAMES for t in type(current).__mro__):
            return True
        current = current.__cause__ or current.__context__
    return False
