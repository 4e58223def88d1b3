"""YARN's error body (`RemoteException`) and the exceptions daemons raise to produce it."""
from __future__ import annotations

from typing import TypedDict

from protocol.errors import ProtocolError


class RemoteExceptionFields(TypedDict):
    """The fields of YARN's RemoteException."""

    exception: str
    message: str
    javaClassName: str


class RemoteExceptionBody(TypedDict):
    """YARN's error body: {"RemoteException": {...}}."""

    RemoteException: RemoteExceptionFields


class ApiError(ProtocolError):
    """An error a handler raises to answer with YARN's RemoteException body; changes no state."""

    status = 500
    exception = "WebApplicationException"
    java_class = "javax.ws.rs.WebApplicationException"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def body(self) -> RemoteExceptionBody:
        return remote_exception_body(self.exception, self.message, self.java_class)


class BadRequest(ApiError):
    status = 400
    exception = "BadRequestException"
    java_class = "org.apache.hadoop.yarn.webapp.BadRequestException"


class ApplicationMasterNotRegistered(BadRequest):
    """An AM called allocate (or finish) for an attempt this RM has not seen register: YARN's
    ApplicationMasterNotRegisteredException. After an RM restart or failover the RM keeps a running
    attempt but not its session; the AM registers again and resends its whole ask table and its
    outstanding releases (appmaster/am_client.py)."""

    exception = "ApplicationMasterNotRegisteredException"
    java_class = "org.apache.hadoop.yarn.exceptions.ApplicationMasterNotRegisteredException"


class ApplicationIdNotHandedOut(BadRequest):
    """A submission names an application id this RM did not hand out (new-application). An id
    handed out by an RM that failed over (or restarted) before the submission reached it is one:
    the client asks the RM it reaches for a new id and submits again (elastane_cli/rm_rest_client.py
    `submit_new`), so the exception has a name of its own (an Elastane extension; YARN accepts any
    id not yet submitted, Elastane only the ids it reserved)."""

    exception = "ApplicationIdNotHandedOutException"


class Unauthorized(ApiError):
    status = 401
    exception = "AuthenticationException"
    java_class = "org.apache.hadoop.security.authentication.client.AuthenticationException"


class Forbidden(ApiError):
    status = 403
    exception = "ForbiddenException"
    java_class = "org.apache.hadoop.yarn.webapp.ForbiddenException"


class NotFound(ApiError):
    status = 404
    exception = "NotFoundException"
    java_class = "org.apache.hadoop.yarn.webapp.NotFoundException"


class Conflict(ApiError):
    status = 409
    exception = "ConflictException"
    java_class = "org.apache.hadoop.yarn.exceptions.YarnException"


class ServiceUnavailable(ApiError):
    status = 503
    exception = "ServiceUnavailableException"
    java_class = "org.apache.hadoop.ipc.StandbyException"


def remote_exception_body(exception: str, message: str, java_class: str) -> RemoteExceptionBody:
    return {"RemoteException": {"exception": exception, "message": message, "javaClassName": java_class}}
