"""How Elastane processes learn the object store's endpoint and credentials: the standard AWS
environment variables, which s3fs (fsspec's S3 backend) and botocore read by themselves.

Operators set them either in the daemons' environment or, once for the cluster, in cluster.toml's
[storage] table (protocol.config.StorageConfig; the conf dir every host has), which the RM, each
NM and the CLI export at start with `apply` -- a variable already in the environment wins, as an
explicit setting beats a config file. Each NM then passes the `FORWARDED` variables of its own
environment into every container it starts (YARN's NM env whitelist), so AMs and executors reach
the store exactly as the daemons do; a job's own launch environment may still override them.
docs/operating.md, "Object storage (S3)".
"""
from __future__ import annotations

import os
from typing import MutableMapping

from .config import StorageConfig

# [storage] key -> the AWS variable it sets
ENV_OF_SETTING: dict[str, str] = {
    "s3_endpoint_url": "AWS_ENDPOINT_URL_S3",
    "s3_region": "AWS_DEFAULT_REGION",
    "s3_access_key_id": "AWS_ACCESS_KEY_ID",
    "s3_secret_access_key": "AWS_SECRET_ACCESS_KEY",
}
CREDENTIAL_VARS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")

# What an NM copies from its environment into every container: the credentials, endpoint and region
# in any of the standard AWS ways, and fsspec's own per-protocol settings (FSSPEC_<PROTOCOL>_<KEY>).
FORWARDED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
             "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_PROFILE",
             "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "AWS_CA_BUNDLE")
FORWARDED_PREFIXES = ("FSSPEC_",)


def environment(cfg: StorageConfig) -> dict[str, str]:
    """The AWS variables [storage] sets (only its non-empty keys)."""
    return {var: getattr(cfg, key) for key, var in ENV_OF_SETTING.items() if getattr(cfg, key)}


def apply(cfg: StorageConfig, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Export [storage] into `environ` (default os.environ) where the environment does not set the
    variable already; returns the names set. The key pair goes as a pair: an environment with
    either credential variable keeps its own credentials whole."""
    env = os.environ if environ is None else environ
    wanted = environment(cfg)
    if any(env.get(v) for v in CREDENTIAL_VARS):
        wanted = {k: v for k, v in wanted.items() if k not in CREDENTIAL_VARS}
    set_now = [k for k in wanted if not env.get(k)]
    for k in set_now:
        env[k] = wanted[k]
    return set_now


def forwarded(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The object-store variables of `environ` (default os.environ) that a container inherits."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if v and (k in FORWARDED or k.startswith(FORWARDED_PREFIXES))}
