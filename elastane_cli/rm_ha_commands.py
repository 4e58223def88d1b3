"""`elastane rm ha-state` and `elastane rm transition-to-standby`: YARN's `rmadmin
-getAllServiceState` and `-transitionToStandby` for the ResourceManagers cluster.toml's [ha] lists
(rm/ha/ha_http.py serves the calls)."""
from __future__ import annotations

import argparse
import asyncio
from typing import Any, Optional

import aiohttp

from protocol import config
from protocol.ha_config import HAConfig, load_ha
from protocol.http_client import JsonHttpClient, RemoteError

from .context import CliContext
from .errors import EXIT_OK, OperationFailed, UsageError
from .rm_rest_client import translate
from .tables import render_table

HA_PATH = "/ws/v1/cluster/ha"
HEADERS = ["RM-ID", "ADDRESS", "STATE", "EPOCH", "SINCE-REASON"]


def add_actions(acts: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The HA actions of the `elastane rm` group (beside `start`)."""
    p = acts.add_parser("ha-state", parents=[common],
                        help="each listed ResourceManager's HA state (yarn rmadmin -getAllServiceState)")
    p.set_defaults(func=cmd_ha_state)
    p = acts.add_parser("transition-to-standby", parents=[common],
                        help="make a ResourceManager give up the active role (yarn rmadmin -transitionToStandby); "
                             "another one takes over")
    p.add_argument("rm_id", nargs="?", help="the RM to switch, one of [ha] rm_ids (default: the active one)")
    p.set_defaults(func=cmd_transition_to_standby)


def ha_settings(ctx: CliContext) -> HAConfig:
    """cluster.toml's [ha] as this client reads it; UsageError when HA is off."""
    from .main import cluster_conf_file  # noqa: PLC0415 - main imports this module

    path = cluster_conf_file(ctx)
    try:
        ha = load_ha(str(path))
    except config.ConfigError as e:
        raise UsageError(f"[ha]: {e}") from None
    if not ha.enabled:
        raise UsageError(f"[ha] is not enabled in {path}: this cluster has one ResourceManager")
    return ha


async def _ha_state(url: str, user: str) -> Optional[dict[str, Any]]:
    """The RM's /ws/v1/cluster/ha, None when it does not answer."""
    client = JsonHttpClient(url, timeout_s=10, user=user)
    try:
        body = await client.get(HA_PATH)
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, RemoteError):
        return None
    finally:
        await client.close()
    st = body.get("ha") if isinstance(body, dict) else None
    return st if isinstance(st, dict) else None


async def _all_states(ha: HAConfig, user: str) -> list[tuple[str, Optional[dict[str, Any]]]]:
    states = await asyncio.gather(*(_ha_state(ha.address_of(i), user) for i in ha.rm_ids))
    return list(zip(ha.rm_ids, states))


def cmd_ha_state(args: argparse.Namespace, ctx: CliContext) -> int:
    ha = ha_settings(ctx)
    rows = []
    for rm_id, st in asyncio.run(_all_states(ha, ctx.user)):
        if st is None:
            rows.append([rm_id, ha.address_of(rm_id), "UNREACHABLE", "", ""])
        else:
            rows.append([rm_id, ha.address_of(rm_id), st.get("state", ""), st.get("epoch") or "", st.get("reason", "")])
    ctx.out.write(render_table(HEADERS, rows) + "\n")
    return EXIT_OK


def cmd_transition_to_standby(args: argparse.Namespace, ctx: CliContext) -> int:
    ha = ha_settings(ctx)

    async def go() -> tuple[str, dict[str, Any]]:
        rm_id = args.rm_id
        if rm_id is None:
            active = [i for i, st in await _all_states(ha, ctx.user) if st is not None and st.get("state") == "ACTIVE"]
            if not active:
                raise OperationFailed(f"no ResourceManager of {', '.join(ha.rm_ids)} is active now")
            rm_id = active[0]
        elif rm_id not in ha.rm_ids:
            raise UsageError(f"rm_id: {rm_id!r} is not one of [ha] rm_ids {ha.rm_ids}")
        url = ha.address_of(rm_id)
        client = JsonHttpClient(url, timeout_s=30, user=ctx.user)
        try:
            body = await client.post(HA_PATH + "/transition-to-standby", {})
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, RemoteError) as e:
            raise translate(e, f"ResourceManager {rm_id}", url) from None
        finally:
            await client.close()
        st = body.get("ha") if isinstance(body, dict) else None
        return str(rm_id), st if isinstance(st, dict) else {}

    rm_id, st = asyncio.run(go())
    ctx.out.write(f"{rm_id}: {st.get('state', '?')} ({st.get('reason', '')})\n")
    return EXIT_OK
