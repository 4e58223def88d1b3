"""The RM web UI's application list: `/cluster/apps`, and `/cluster/apps/{STATE}` as in YARN."""
from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Optional

from protocol.records import AppState

from .. import rest_views as views
from .layout import Column, escape, live_table, page

if TYPE_CHECKING:
    from ..context import RmContext

APPS = "/ws/v1/cluster/apps"

APP_COLUMNS = (
    Column("ID", "id", "app"), Column("User", "user"), Column("Name", "name"), Column("Queue", "queue"),
    Column("Type", "applicationType"), Column("State", "state", "state"), Column("Final status", "finalStatus"),
    Column("Progress", "progress", "pct"), Column("Containers", "runningContainers", "int"),
    Column("Memory", "allocatedMB", "mb"), Column("VCores", "allocatedVCores", "int"),
    Column("Workers", "shape.workers", "int"), Column("Servers", "shape.servers", "int"),
    Column("Speed", "shape.speed", "speed"), Column("Spilled", "shape.spilled_mb", "mb"),
    Column("Started", "startedTime", "age"), Column("Elapsed", "elapsedTime", "duration_ms"),
)


def apps_table(rm: "RmContext", now_ms: float, state: Optional[AppState] = None,
               css_id: str = "apps") -> str:
    """The live table of apps (in `state`, or all), newest first."""
    core = rm.core
    apps = [views.app_json(core, a) for a in core.apps.values() if state is None or a.state is state]
    src = APPS if state is None else f"{APPS}?{urllib.parse.urlencode({'states': state.value})}"
    return live_table(css_id, src, ["apps", "app"], APP_COLUMNS, apps, now_ms, sort_key="id", descending=True,
                      empty="no applications")


def render_apps_page(rm: "RmContext", now_ms: float, state: Optional[AppState] = None) -> str:
    """The page listing the apps (in `state`, or all), with links to each state's list."""
    links = ['<a href="/cluster/apps">ALL</a>'] + [
        f'<a href="/cluster/apps/{s.value}">{escape(s.value)}</a>' for s in AppState]
    title = "Applications" if state is None else f"{state.value} applications"
    body = (f"<h1>{escape(title)}</h1><p class=filters>{''.join(links)}</p>"
            f"{apps_table(rm, now_ms, state)}")
    return page(title, body, active="/cluster/apps")


def parse_state(text: str) -> Optional[AppState]:
    """The app state a `/cluster/apps/{state}` path names (any case); None when it names none."""
    try:
        return AppState(text.upper())
    except ValueError:
        return None


__all__ = ["APP_COLUMNS", "apps_table", "parse_state", "render_apps_page"]
