"""Environment variables the NM sets in every container (YARN's names where YARN has one), and
what makes an environment impossible to launch a container with."""

CONTAINER_ID = "CONTAINER_ID"
NM_HOST = "NM_HOST"
NM_PORT = "NM_HTTP_PORT"
NM_HTTP_ADDRESS = "NM_HTTP_ADDRESS"
APP_ID = "APPLICATION_ID"
APP_ATTEMPT_ID = "APPLICATION_ATTEMPT_ID"
USER = "USER"
LOG_DIRS = "LOG_DIRS"
PWD = "PWD"
CONTAINER_MEMORY_MB = "CONTAINER_MEMORY_MB"
CONTAINER_VCORES = "CONTAINER_VCORES"
# Set by the RM for an AM container only:
RM_ADDRESS = "ELASTANE_RM_ADDRESS"       # http://host:port of the RM
# With cluster.toml's [ha]: every RM's URL, comma-separated, the launching RM's first; the AM's RM
# client fails over between them (appmaster/rm_client.py). Unset without HA.
RM_ADDRESSES = "ELASTANE_RM_ADDRESSES"
AM_TOKEN = "ELASTANE_AM_TOKEN"           # the attempt's AM token
APP_SUBMITTER = "APP_SUBMITTER"
# The app's durable dir for checkpoints: <checkpoint_dir>/<app_id> (rm.toml), an absolute path or an
# fsspec URL (protocol.durable_storage); by default <state_dir>/apps/<app_id>.
AM_DIR = "ELASTANE_AM_DIR"
# Set by the RM for an AM container, and by a PS AM for its executors (never on a command line):
JOB_SECRET = "ELASTANE_JOB_SECRET"       # the attempt's job secret (protocol.tokens.job_secret), hex
# Set by an NM whose network_bandwidth_bps > 0 (emulated node bandwidth cap, bits per second):
NODE_BANDWIDTH_BPS = "ELASTANE_NODE_BANDWIDTH_BPS"
# Set by a PS AM for the executors of a job that Harmony runs (its ShapeDirective has a group), and
# only then: the executor takes a slot from its node's arbiter before each subtask.
HARMONY = "ELASTANE_HARMONY"             # "1" for a Harmony job's executors
# Set by the NM beside HARMONY=1 (only in the containers whose launch environment has it):
ARBITER_SOCKET = "ELASTANE_ARBITER_SOCKET"   # the arbiter's unix socket path
# Set by whoever launches a container that has a role (the RM: "am"; a PS AM: "worker" / "server"):
# the NM labels the container's utilization metrics with it.
CONTAINER_ROLE = "ELASTANE_CONTAINER_ROLE"


def environment_problem(env: dict[str, str]) -> str | None:
    """What makes `env` impossible to launch a process with (a key that is empty or holds "=" or
    NUL, a value holding NUL: the kernel's environment cannot carry them), or None."""
    for key, value in env.items():
        if not key:
            return "key must not be empty"
        if "=" in key or "\0" in key:
            return f"key {key!r} must not contain '=' or NUL"
        if "\0" in value:
            return f"the value of {key!r} must not contain NUL"
    return None
