"""TOML configuration: conf/rm.toml, conf/nm.toml, conf/cluster.toml, with documented defaults.

Each file maps onto a msgspec Struct; an unknown key or a wrong type is an error naming the key.
Command-line flags override file values (see `merge`).
"""
from __future__ import annotations

import math
import os
import re
import socket
import tomllib
from pathlib import Path
from typing import Any, Literal, Optional, TypeVar, get_args, get_origin

import msgspec

from . import durable_storage, tokens
from .node_labels import check_cluster, check_labels
from protocol.errors import ConfigurationError

T = TypeVar("T", bound=msgspec.Struct)
CONF_DIR = Path(os.environ.get("ELASTANE_CONF_DIR", Path(__file__).resolve().parent.parent / "conf"))


class ConfigError(ConfigurationError, ValueError):
    """A config file or flag that is missing, malformed or has an unknown key."""


class QueueConfig(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    capacity: float = 100.0          # percent of the cluster guaranteed to this queue
    max_capacity: float = 100.0      # percent it may grow to when others are idle
    # Fraction of this queue's capacity its AMs may hold; None = RMConfig.max_am_resource_percent.
    max_am_resource_percent: Optional[float] = None
    # YARN's disable_preemption: nothing this queue holds is reclaimed for other queues
    # (docs/preemption.md).
    disable_preemption: bool = False
    # YARN's default- and maximum-application-lifetime (seconds; <= 0: none): an app submitted
    # without a lifetime gets the default, and none may live longer than the maximum from its
    # submission (rm/app_lifetime.py).
    default_app_lifetime_s: int = -1
    max_app_lifetime_s: int = -1


class RMConfig(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "0.0.0.0"
    advertise_host: str = ""        # host name AMs and NMs use to reach the RM ("" = hostname / 127.0.0.1)
    port: int = 8088
    state_dir: str = "/tmp/elastane/rm"
    nm_expiry_s: float = 10.0
    am_expiry_s: float = 10.0
    nm_heartbeat_interval_ms: int = 1000
    max_app_attempts: int = 2       # cluster-wide cap on an app's max-app-attempts
    # YARN's yarn.resourcemanager.max-completed-applications: the RM keeps this many finished,
    # failed or killed apps (in memory and in its state store) and forgets the oldest beyond it.
    max_completed_apps: int = 1000
    policy: str = "static"          # static | drf | tetris | eps | optimus | dorm | harmony
    minimum_allocation_mb: int = 32
    maximum_allocation_mb: int = 65536
    maximum_allocation_vcores: int = 64
    container_token_lifetime_s: float = 86400.0
    # Fraction (0, 1] of a queue's capacity that its ApplicationMasters may hold, as YARN's
    # yarn.scheduler.capacity.maximum-am-resource-percent; a queue always admits at least one AM.
    max_am_resource_percent: float = 0.5
    queues: list[QueueConfig] = msgspec.field(default_factory=lambda: [QueueConfig(name="default")])
    # Dorm's thresholds (Dorm §IV-B, eq. 15-16), fractions in [0, 1]: θ1 bounds the cluster's DRF
    # fairness loss (sum over jobs of |share - DRF share| <= θ1 x 2m, m resource types) and θ2 the
    # adjustment overhead (at most ceil(θ2 x running jobs) jobs resized per decision).
    dorm_fairness_threshold: float = 0.1
    dorm_adjustment_threshold: float = 0.5
    # Harmony (docs/harmony_policy.md): the link bandwidth of the nodes' NICs in bits/s. A job's COMM
    # on m nodes pays (m-1)/m of its bytes per mini-batch on it (models/harmony.py `net_time`);
    # 0 = unknown: COMM constant in the group's nodes, as in the paper.
    harmony_link_bandwidth_bps: float = 0.0
    # Gang admission of PS jobs (rm/scheduler.py): a job's AM container starts only when the AM and
    # its `gang_shape` of executors fit together (queue headroom and nodes), so a job holds nothing
    # until it can run. "submitted" (default): workers + servers, what the PS AM waits for before it
    # trains (appmaster/ps/runtime/master.py starts every submitted executor first); "minimum":
    # min_workers + min_servers, for AMs that train on their minimum and grow -- with today's PS AM it
    # admits jobs that then starve each other (bench/gang_admission.py --testbed measured it).
    gang_admission: bool = True
    gang_shape: Literal["minimum", "submitted"] = "submitted"
    # Where AMs keep checkpoints and durable state, one `<checkpoint_dir>/<app_id>` per app: storage
    # every host reads, so a new attempt on another host resumes from the last one's checkpoint.
    # An absolute path or file:// URL (a shared mount), or any fsspec URL (s3://bucket/prefix);
    # "" = <state_dir>/apps, a path on each AM's own host (fine for a one-host cluster).
    checkpoint_dir: str = ""
    # The cluster's node labels (all exclusive, protocol/node_labels.py): an NM reporting another is
    # refused. `am_node_label`, one of them, puts every AM container on the nodes carrying it and
    # only there ("" = AMs go where executors go); executors never go to a labelled node.
    node_labels: list[str] = []
    am_node_label: str = ""
    # Capacity preemption (docs/preemption.md, YARN's ProportionalCapacityPreemptionPolicy): each
    # policy round computes every queue's ideal share and takes back what queues hold over it.
    # "shrink": elastic PS jobs are shrunk toward their minimum shape first (no work lost), only
    # what cannot shrink has containers killed; "kill": YARN's way, containers killed whatever the
    # job; "off": nothing is reclaimed.
    preemption: Literal["off", "kill", "shrink"] = "shrink"
    # YARN's max_ignored_over_capacity: a queue within (1 + this) x its guarantee is left alone.
    preemption_max_ignored_over_capacity: float = 0.1
    # YARN's natural_termination_factor: the fraction of a queue's excess taken back per round.
    preemption_natural_termination_factor: float = 0.2
    # YARN's max_wait_before_kill: seconds between telling an AM (shrink directive or preemption
    # message) and killing what it has not given back.
    preemption_max_wait_before_kill_s: float = 15.0
    # A job shrunk for another queue is not grown again by any policy for this many rounds.
    preemption_hold_rounds: int = 30

    def __post_init__(self) -> None:
        if not 0 <= self.preemption_max_ignored_over_capacity <= 1:      # (NaN too)
            raise ValueError(f"preemption_max_ignored_over_capacity must be within [0, 1], "
                             f"got {self.preemption_max_ignored_over_capacity}")
        if not 0 < self.preemption_natural_termination_factor <= 1:
            raise ValueError(f"preemption_natural_termination_factor must be within (0, 1], "
                             f"got {self.preemption_natural_termination_factor}")
        if not self.preemption_max_wait_before_kill_s >= 0:
            raise ValueError(f"preemption_max_wait_before_kill_s must be >= 0 (seconds), "
                             f"got {self.preemption_max_wait_before_kill_s}")
        if self.max_completed_apps < 0:
            raise ValueError(f"max_completed_apps must be >= 0, got {self.max_completed_apps}")
        if self.preemption_hold_rounds < 0:
            raise ValueError(f"preemption_hold_rounds must be >= 0, got {self.preemption_hold_rounds}")
        if not self.harmony_link_bandwidth_bps >= 0:        # (NaN too)
            raise ValueError(f"harmony_link_bandwidth_bps must be >= 0 (bits/s, 0 = unknown), "
                             f"got {self.harmony_link_bandwidth_bps}")
        check_cluster(self.node_labels, self.am_node_label)
        if self.checkpoint_dir:
            try:
                durable_storage.validate(self.checkpoint_dir)
            except durable_storage.DurableStorageError as e:
                raise ValueError(f"checkpoint_dir: {e}") from None


class NMConfig(msgspec.Struct, forbid_unknown_fields=True):
    host: str = "0.0.0.0"
    # The node's address for the RM, AMs and containers (NM_HOST); "" = the bound address, or for
    # 0.0.0.0 / :: the address of the interface that routes to the RM (127.0.0.1 if it is on loopback).
    advertise_host: str = ""
    port: int = 8042
    rm_address: str = ""            # "" = cluster.toml's rm_address
    memory_mb: int = 0              # 0 = detect from /proc/meminfo (minus reserved)
    vcores: int = 0                 # 0 = detect os.cpu_count()
    reserved_memory_mb: int = 1024  # kept for the OS when detecting
    rack: str = "/default-rack"
    heartbeat_interval_ms: int = 1000
    local_dir: str = "/tmp/elastane/nm/local"
    log_dir: str = "/tmp/elastane/nm/logs"
    recovery_dir: str = "/tmp/elastane/nm/recovery"
    cgroups: str = "auto"           # auto | v1 | v2 | off
    cgroup_name: str = "elastane"   # parent cgroup (per NM it becomes elastane/<node>)
    cpu_enforcement: str = "hard"   # hard (quota = vcores x period) | soft (shares)
    cpu_period_us: int = 100000
    # Hard mode only: the cores this node's containers get in all, shared out by vcore (YARN's
    # strict cgroups mode with percentage-physical-cpu-limit); 0 = a vcore is one core.
    cpu_limit_cores: float = 0.0
    monitor_interval_ms: int = 500  # RSS monitor period when cgroups are unusable
    # Modules an executor zygote preloads so containers offering them as their warm start fork from
    # it instead of starting an interpreter (nodemanager.warm_launcher); [] = no zygote. The apps'
    # modules too: an executor imports its app when the AM binds it (0.1-0.15 s each, scipy.sparse
    # and the app), which an EPS add would otherwise wait for.
    warm_modules: list[str] = msgspec.field(default_factory=lambda: [
        "psruntime.executor", "psruntime.apps.mlr", "psruntime.apps.nmf", "psruntime.apps.lda",
        "psruntime.apps.lasso"])
    # Shells kept started, each already in a cgroup of its own, so a launch skips the cgroup join's
    # wait on the launch path (nodemanager.container_shell_pool); 0 = every launch joins cold.
    # Only where cgroups enforce the limits.
    container_shells: int = 4
    # Children of the executor zygote kept forked, each already in a cgroup of its own, so a warm
    # launch skips the cgroup join's wait too (nodemanager.warm_spares); 0 = every warm launch joins.
    # Only with a zygote (warm_modules) and where cgroups enforce the limits.
    warm_spares: int = 2
    # How long a finished container's logs stay on this node. With log aggregation on (cluster.toml's
    # remote_app_log_dir), counted from the app's final upload: until then they stay whatever this says.
    keep_finished_logs_s: float = 3600.0
    # Log aggregation's rolling upload of running apps' logs, every this many seconds (YARN's
    # log-aggregation.roll-monitoring-interval-seconds); 0 = only the final upload at app end.
    log_roll_interval_s: float = 0.0
    # Node health (YARN's NodeHealthCheckerService, nodemanager/node_health.py): the node reports
    # itself unhealthy -- the RM places nothing on it -- while a filesystem of local_dir, log_dir or
    # recovery_dir is this full or has less than min_free_disk_mb free, or while health_script
    # (run every health_check_interval_s, at most health_script_timeout_s) prints a line starting
    # with ERROR. "" = no script.
    max_disk_utilization_percent: float = 90.0
    min_free_disk_mb: int = 0
    health_script: str = ""
    health_script_timeout_s: float = 60.0
    health_check_interval_s: float = 60.0
    delete_workdir: bool = True
    network_bandwidth_bps: int = 0  # emulated node bandwidth cap (bit/s) passed to containers; 0 = none
    arbiter: bool = True            # run the Harmony arbiter (an aux service on a unix socket)
    arbiter_socket: str = ""        # its path; "" = <local_dir>/arbiter.sock (or a short temp path)
    # The arbiter's CPU pool: cores its COMPs' threads share (docs/harmony_arbiter.md); 0 = the cores
    # the NM's cgroup root allows (its cpu.max quota / period, rounded up), else the CPU count.
    arbiter_cpu_pool: int = 0
    # Local resources (nodemanager.localizer): the PUBLIC + PRIVATE cache's bound (least recently
    # used entries no container uses are evicted over it; YARN's localizer.cache.target-size-mb),
    # the time one resource's fetch may take before the container fails, and the fetch threads.
    localizer_cache_mb: int = 10240
    localizer_fetch_timeout_s: float = 600.0
    localizer_threads: int = 4
    # The labels this node carries (protocol/node_labels.py; each must be one of rm.toml's
    # node_labels): e.g. ["am"] on a master host that runs the AMs, outside the workers' partition.
    node_labels: list[str] = []

    def __post_init__(self) -> None:
        check_labels(self.node_labels)


class ClusterConfig(msgspec.Struct, forbid_unknown_fields=True):
    secret: str = ""                # HMAC key; generated by `elastane secret` on first start
    rm_address: str = "http://127.0.0.1:8088"
    admins: list[str] = msgspec.field(default_factory=lambda: ["root"])
    token_lifetime_s: float = 86400.0
    # simple (user.name) | token (bearer tokens in client_tokens); anything else is an error, never
    # a fallback to simple auth (which would serve every app's logs to anyone).
    client_auth: Literal["simple", "token"] = "simple"
    client_tokens: dict[str, str] = {}   # token -> user, when client_auth = "token"
    # Where `elastane ps submit --py-files/--files/--archives` uploads a job's files, under
    # <staging_dir>/<user>/<application-id>/: a path or URL every host reads (a shared mount, or an
    # fsspec URL). "" = none: local files are referenced in place (one host or shared paths only).
    staging_dir: str = ""
    # Log aggregation (YARN's remote-app-log-dir): where every NM uploads the logs of an app's
    # containers once the app ends (one file per node per app, protocol/aggregated_logs.py), and
    # where `elastane app logs` and the RM's log pages read them. A path every host reads (a shared
    # mount) or an fsspec URL (s3://bucket/logs). "" = no aggregation: logs stay on the nodes.
    remote_app_log_dir: str = ""
    # YARN's log-aggregation.retain-seconds: the RM deletes an app's aggregated logs once the app
    # is over and every file of them is this many seconds old (rm/log_retention.py); -1 = keep
    # them until an operator deletes them (YARN's default).
    remote_app_log_retain_s: float = -1.0
    # YARN's log-aggregation.retain-check-interval-seconds: how often the RM looks; 0 = a tenth of
    # remote_app_log_retain_s (YARN's default), at least a minute.
    remote_app_log_retain_check_s: float = 0.0

    def __post_init__(self) -> None:
        # (A file's value is checked by its Literal type already; this catches code and merges.)
        if self.client_auth not in ("simple", "token"):
            raise ValueError(f"client_auth must be one of 'simple', 'token', got {self.client_auth!r}")
        if not (self.token_lifetime_s > 0 and math.isfinite(self.token_lifetime_s)):     # (NaN too)
            raise ValueError(f"token_lifetime_s must be a positive number of seconds, got {self.token_lifetime_s}")
        retain, check = self.remote_app_log_retain_s, self.remote_app_log_retain_check_s
        if not (retain == -1 or (retain > 0 and math.isfinite(retain))):
            raise ValueError(f"remote_app_log_retain_s must be -1 (keep) or > 0 (seconds), got {retain}")
        if not (check >= 0 and math.isfinite(check)):
            raise ValueError(f"remote_app_log_retain_check_s must be >= 0 (seconds; 0: a tenth of the "
                             f"retention), got {check}")
        if retain > 0 and not self.remote_app_log_dir:
            raise ValueError("remote_app_log_retain_s is set but remote_app_log_dir is empty (no logs are "
                             "aggregated): set remote_app_log_dir, or leave remote_app_log_retain_s at -1")

    @property
    def log_retain_check_s(self) -> float:
        """How often the RM looks for aggregated logs past retention (0 when it keeps them)."""
        if self.remote_app_log_retain_s <= 0:
            return 0.0
        return self.remote_app_log_retain_check_s or max(60.0, self.remote_app_log_retain_s / 10)


class StorageConfig(msgspec.Struct, forbid_unknown_fields=True):
    """cluster.toml's [storage]: how every Elastane process reaches the object store its s3:// URLs
    name (like Hadoop's fs.s3a.* in core-site.xml). Each set key becomes the standard AWS variable
    that s3fs / botocore read (protocol/storage_settings.py), in the RM, each NM, every container
    an NM starts, and the CLI -- unless that process's environment already sets the variable."""

    s3_endpoint_url: str = ""        # AWS_ENDPOINT_URL_S3, e.g. "http://seaweed1:8333"; "" = AWS's own
    s3_region: str = ""              # AWS_DEFAULT_REGION
    s3_access_key_id: str = ""       # AWS_ACCESS_KEY_ID
    s3_secret_access_key: str = ""   # AWS_SECRET_ACCESS_KEY

    def __post_init__(self) -> None:
        url = self.s3_endpoint_url
        if url and (not url.startswith(("http://", "https://")) or not url.split("://", 1)[1].strip("/")):
            raise ValueError(f"s3_endpoint_url must be an http:// or https:// URL, got {url!r}")
        if bool(self.s3_access_key_id) != bool(self.s3_secret_access_key):
            raise ValueError("s3_access_key_id and s3_secret_access_key go together: set both or neither")


# The tables each file may hold (a misspelt one -- [[queue]], [HA], [storag] -- was read by no
# loader and silently gave the defaults: one RM without HA, every queue gone but "default").
RM_TABLES = frozenset({"rm", "queues", "ha"})
NM_TABLES = frozenset({"nm"})
CLUSTER_TABLES = frozenset({"cluster", "storage", "ha"})


def load(path: str | Path | None, typ: type[T], section: str, tables: frozenset[str] | None = None) -> T:
    """Load `[section]` of a TOML file into `typ`; a missing file gives the defaults. With
    `tables`, a table the file holds that is not one of them is a ConfigError naming it."""
    data: dict[str, Any] = {}
    if path is not None and Path(path).exists():
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{path}: {e}") from None
        # A key outside every [section] is read by no loader: most likely a setting whose
        # section header is missing, which would otherwise be dropped without a word.
        stray = sorted(k for k, v in raw.items() if not isinstance(v, (dict, list)))
        if stray:
            raise ConfigError(f"{path}: {', '.join(stray)} outside any [section] (each setting goes "
                              f"under its table, e.g. [{section}])")
        unknown = sorted(k for k, v in raw.items() if isinstance(v, (dict, list)) and tables is not None
                         and k not in tables)
        if unknown:
            raise ConfigError(f"{path}: unknown table(s) {', '.join(f'[{k}]' for k in unknown)}; this file's "
                              f"tables are {', '.join(f'[{k}]' for k in sorted(tables or ()))}")
        data = raw.get(section, {})
        # Queues are an array of tables at the top level of rm.toml.
        if typ is RMConfig and "queues" in raw:
            data = dict(data, queues=raw["queues"])
    try:
        return msgspec.convert(data, typ, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(f"{path or typ.__name__}: [{section}] {e}{_allowed_hint(typ, str(e))}") from None


def _literal_values(typ: type[msgspec.Struct], key: str) -> tuple[Any, ...]:
    """The values a Literal-typed field `key` of `typ` allows (() if it is not one)."""
    for f in msgspec.structs.fields(typ):
        if f.name == key:
            return get_args(f.type) if get_origin(f.type) is Literal else ()
    return ()


def _allowed_hint(typ: type[msgspec.Struct], message: str) -> str:
    """For msgspec's "Invalid enum value 'x' - at `$.key`" on a Literal field: the values allowed."""
    m = re.fullmatch(r"Invalid enum value .* - at `\$\.(\w+)`", message)
    allowed = _literal_values(typ, m.group(1)) if m else ()
    return f" ({m.group(1)} must be one of {', '.join(repr(v) for v in allowed)})" if m and allowed else ""


def merge(cfg: T, **overrides: Any) -> T:
    """Apply non-None overrides (from CLI flags) to a config struct."""
    values = {k: v for k, v in overrides.items() if v is not None}
    return msgspec.structs.replace(cfg, **values) if values else cfg


def load_rm(path: Optional[str] = None) -> RMConfig:
    return load(path or CONF_DIR / "rm.toml", RMConfig, "rm", RM_TABLES)


def nm_hostname() -> str:
    """The name that picks this host's override file: $ELASTANE_HOSTNAME, else the hostname."""
    return os.environ.get("ELASTANE_HOSTNAME") or socket.gethostname()


def load_nm(path: Optional[str] = None, hostname: Optional[str] = None) -> NMConfig:
    """nm.toml, then the `[nm]` keys of `nm-<hostname>.toml` beside it, if that exists (hostname:
    `nm_hostname()`), so one conf dir shared by every host can still give each its own address or
    capacity. Unknown keys or wrong types in either file are errors naming that file."""
    base_path = Path(path) if path else CONF_DIR / "nm.toml"
    cfg = load(base_path, NMConfig, "nm", NM_TABLES)
    host_path = base_path.with_name(f"nm-{hostname or nm_hostname()}.toml")
    if not host_path.is_file():
        return cfg
    overrides = load(host_path, NMConfig, "nm")     # checks the file's keys and types, naming it
    with open(host_path, "rb") as f:
        raw = tomllib.load(f)
    # Only [nm] is read from it: another table (a typo of [nm]) would otherwise be silently ignored.
    stray = sorted(set(raw) - {"nm"})
    if stray:
        raise ConfigError(f"{host_path}: only [nm] is read from a host's override file, found {', '.join(stray)}")
    return msgspec.structs.replace(cfg, **{k: getattr(overrides, k) for k in raw.get("nm", {})})


def load_cluster(path: Optional[str] = None) -> ClusterConfig:
    return load(path or CONF_DIR / "cluster.toml", ClusterConfig, "cluster", CLUSTER_TABLES)


def load_storage(path: Optional[str] = None) -> StorageConfig:
    """cluster.toml's [storage] table (the defaults, all empty, without one)."""
    return load(path or CONF_DIR / "cluster.toml", StorageConfig, "storage", CLUSTER_TABLES)


def ensure_secret(path: str | Path) -> str:
    """Return the cluster secret in `path`, generating it (and the file) on first start."""
    path = Path(path)
    cfg = load(path, ClusterConfig, "cluster") if path.exists() else ClusterConfig()
    if cfg.secret:
        return cfg.secret
    secret = tokens.generate_secret()
    text = path.read_text() if path.exists() else "[cluster]\n"
    line = f'secret = "{secret}"'
    # Line-anchored: an empty `secret` under any quoting or spacing is replaced; else the line goes
    # right under the [cluster] header (any spacing, a comment after it); else a [cluster] table
    # is added. The file is read back below: a secret generated and not saved (each RM start its
    # own, NMs refused) is an error, not a success.
    empty = re.compile(r"^[ \t]*secret[ \t]*=[ \t]*(\"\"|'')[ \t]*(#.*)?$", re.M)
    header = re.compile(r"^[ \t]*\[[ \t]*cluster[ \t]*\][ \t]*(#.*)?$", re.M)
    if empty.search(text):
        text = empty.sub(line, text, count=1)
    elif (m := header.search(text)) is not None:
        text = f"{text[:m.end()]}\n{line}{text[m.end():]}"
    else:
        text = f"[cluster]\n{line}\n\n{text}"
    path.parent.mkdir(parents=True, exist_ok=True)
    # durable: the cluster's secret must survive a crash; 0600 from the first byte
    durable_storage.write_atomic(path, text.encode(), mode=0o600)
    if load(path, ClusterConfig, "cluster").secret != secret:
        raise ConfigError(f"{path}: the generated cluster secret could not be written into [cluster]; "
                          "set `secret` there by hand")
    return secret
