"""Who a client call is from, and whether it may read an app's logs: what the RM's REST API and web
UI and the NMs' log calls decide alike (cluster.toml's `client_auth`, `client_tokens`, `admins`).

With `client_auth = "simple"` (Hadoop's simple auth) the caller is whoever `?user.name=` says
(default dr.who) and logs are open, as YARN's are without security. With "token" the caller is
the user of a client bearer token (`Authorization: Bearer <token>`; the CLI sends
$ELASTANE_CLIENT_TOKEN), and an app's logs are its owner's and the admins' alone -- YARN's view
ACL, which its secure mode applies to the RM's and NMs' log pages.
"""
from __future__ import annotations

from typing import Optional

from aiohttp import web

from . import tokens
from .config import ClusterConfig
from .remote_exception import Forbidden, Unauthorized

ANONYMOUS = "dr.who"                      # Hadoop's default user under simple auth
CLIENT_TOKEN_ENV = "ELASTANE_CLIENT_TOKEN"  # the client token the CLI sends, under token auth


def client_user(cluster: ClusterConfig, authorization: Optional[str], simple_user: str) -> str:
    """The caller: the user of the bearer token in `authorization` under token auth
    (Unauthorized without a known one), else `simple_user` (its ?user.name=) or dr.who."""
    if cluster.client_auth != "simple":     # fail closed: only "simple" trusts ?user.name=
        tok = tokens.token_from_header(authorization)
        if tok is None:
            raise Unauthorized("this cluster requires 'Authorization: Bearer <client token>'")
        user = cluster.client_tokens.get(tok)
        if user is None:
            raise Unauthorized("unknown client token")
        return user
    return simple_user or ANONYMOUS


def request_user(cluster: ClusterConfig, request: web.Request) -> str:
    """`client_user` of an HTTP request (its Authorization header, its ?user.name=): the RM's REST
    API and HA calls, its log pages and the NMs' log calls all ask this."""
    return client_user(cluster, request.headers.get("Authorization"), request.query.get("user.name", ""))


def check_log_reader(cluster: ClusterConfig, user: str, owner: Optional[str], what: str) -> None:
    """Forbidden unless `user` may read `what` (an app's or a container's logs) owned by `owner`
    (None: not known here, so only an admin may): anyone under simple auth, else the owner or an
    admin."""
    if cluster.client_auth == "simple" or user in cluster.admins or (owner and user == owner):
        return
    raise Forbidden(f"user {user} may not read the logs of {what} (owner {owner or 'unknown here'}; "
                    f"admins: {', '.join(cluster.admins)})")
