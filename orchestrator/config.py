"""Typed project configuration with one documented precedence.

    built-in defaults  <  orch.toml  <  ORCH_<SECTION>__<KEY> environment  <  --set section.key=value

``orch.toml`` is found by walking up from the working directory (like git); ``--config PATH`` or
``ORCH_CONFIG`` names it explicitly. Every layer is merged into one dict first and validated once by
pydantic, so an error can name the file (or variable, or flag), the key, the bad value and what is
allowed. Secrets are never configuration values: the Proxmox API token (``proxmox.load_token``) and the
values of ``[project] secrets`` (only their names are settings; ``secrets.collect`` reads the values).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, ValidationInfo, create_model,
                      field_validator, model_validator)

from .batching import config as batching_keys
from .errors import ConfigError

CONFIG_NAME = "orch.toml"
ENV_PREFIX = "ORCH_"
#: old key -> (the key that replaced it, what changed); the old one is still read, with a warning naming the new one
RENAMED = {
    "distributed.max_restarts": ("run.restarts", ""),
    "run.stall_timeout": ("run.stall_after", ""),
    "metrics.stall_after": ("run.stall_after", ", which also stops a run whose log stops"),
}


SECRET_VALUE = "secret_value"  # the error type of a value refused for holding a secret: it is never echoed


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ProjectSection(_Section):
    name: str = "project"
    sources: list[str] = Field(default_factory=lambda: ["."])
    follow_symlinks: list[str] = Field(default_factory=list)  # symlinks whose target outside the project is sent
    command: str | list[str] = "python3 train.py"
    env: dict[str, str] = Field(default_factory=dict)
    secrets: list[str] = Field(default_factory=list)  # names only; values: environment or .orch/secrets.env
    total_steps: int | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "-_" for c in v):
            raise ValueError("must be letters, digits, '-' or '_' (it names the tmux session)")
        return v

    @field_validator("sources", "follow_symlinks")
    @classmethod
    def _sources(cls, v: list[str], info: ValidationInfo) -> list[str]:
        if not v and info.field_name == "sources":
            raise ValueError("must list at least one file or folder")
        for s in v:
            if os.path.isabs(s) or ".." in Path(s).parts:
                raise ValueError(f"{s!r} must be a path inside the project folder")
        return v

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, v: list[str]) -> list[str]:
        import re

        for name in v:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
                raise ValueError(f"{name!r} is not an environment variable name (letters, digits, '_')")
        if len(set(v)) != len(v):
            raise ValueError("names a secret twice")
        return v

    @model_validator(mode="after")
    def _secrets_not_in_env(self) -> "ProjectSection":
        both = sorted(set(self.secrets) & set(self.env))
        if both:
            raise ValueError(f"{', '.join(both)} is both in env (a recorded value) and in secrets; keep it in secrets")
        return self

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: object) -> object:
        if isinstance(v, dict):  # numbers and booleans from TOML or --set become the strings a process sees
            return {k: (str(x).lower() if isinstance(x, bool) else str(x))
                    if isinstance(x, (int, float, bool)) else x for k, x in v.items()}
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str]) -> str | list[str]:
        if not (v.strip() if isinstance(v, str) else v):
            raise ValueError("must not be empty")
        return v


class PathsSection(_Section):
    root: str = "/workspace/orch"
    checkpoints: str = "/workspace/checkpoints/{project}"  # {project}: [project] name, one folder per project


class _BatchingChecks(_Section):
    """What ties ``[batching]`` keys together; the keys themselves come from ``batching.config.KEYS``."""

    @model_validator(mode="after")
    def _consistent(self) -> "_BatchingChecks":
        values = self.model_dump()
        if values["token_budget"] < values["max_seq_len"]:
            raise ValueError(f"token_budget ({values['token_budget']}) must be at least max_seq_len "
                             f"({values['max_seq_len']})")
        b = values["buckets"]
        if b is not None and (len(b) < 2 or b[0] != 0 or any(x >= y for x, y in zip(b, b[1:]))):
            raise ValueError("buckets must be ascending boundaries starting at 0, e.g. [0, 770, 1216, 8192]")
        return self


def _batching_field(key: batching_keys.Key) -> tuple[Any, Any]:
    """The pydantic (annotation, Field) of one ``[batching]`` key of the table."""
    kind: Any = list[int] if key.type is list else key.type
    if key.choices:
        kind = Literal[key.choices]  # type: ignore[valid-type]
    if key.default is None:
        kind = kind | None
    return kind, Field(key.default, ge=key.minimum, gt=key.above, le=key.maximum, description=key.doc)


BatchingSection = create_model("BatchingSection", __base__=_BatchingChecks, __module__=__name__,
                               **{name: _batching_field(key) for name, key in batching_keys.KEYS.items()})


_SLURM_TIME = r"(UNLIMITED|INFINITE|[0-9]+(:[0-9]{1,2}){0,2}|[0-9]+-[0-9]{1,2}(:[0-9]{1,2}){0,2})"
SLURM_KEYS = ("partition", "account", "qos", "time", "sbatch_args", "signal", "resubmit")  # [slurm] and a target's
#: sbatch options orch sets itself for every job (``agent/run/slurm.sbatch_argv``): in sbatch_args they would fight it
SBATCH_OWN = ("--output", "--error", "--chdir", "--parsable", "--test-only", "--open-mode", "--job-name",
              "--nodes", "--ntasks-per-node", "--wrap", "-o", "-e", "-D", "-J", "-N")


def _slurm_time(value: str | None) -> str | None:
    """``time``: one of sbatch's forms, so that a typo is refused here rather than by Slurm at the deploy."""
    if value is not None and not re.fullmatch(_SLURM_TIME, value):
        raise ValueError('is not a Slurm time limit: minutes ("30"), "MM:SS", "HH:MM:SS", "D-HH", "D-HH:MM:SS" '
                         'or "UNLIMITED"')
    return value


def _slurm_signal(value: str | None) -> str | None:
    """``signal``: what the run's supervisor takes as a stop (INT or TERM), and how long before the time limit."""
    sig, _, seconds = (value or "").partition("@")
    if value is not None and (sig not in ("INT", "TERM") or not seconds.isdigit()):
        raise ValueError('must be "INT@<seconds>" or "TERM@<seconds>": the signal the run gets that many seconds '
                         "before its time limit, to checkpoint")
    return value


def _sbatch_args(args: list[str]) -> list[str]:
    """``sbatch_args``: options only (a script or its arguments would follow orch's ``job.sh``), none of orch's."""
    for arg in args:
        if not arg.startswith("-"):
            raise ValueError(f"{arg!r} is not an sbatch option: each item is one option, e.g. \"--mem=32G\"")
        name = arg.split("=", 1)[0]
        if name in SBATCH_OWN:
            raise ValueError(f"{name} is set by orch for every job (its output, folder, name and nodes); "
                             "use --nodes N on the command line for nodes")
    return args


class SlurmSection(_Section):
    """``[slurm]``: the options of every ``kind = "slurm"`` target's jobs; a target's own keys win over these."""

    partition: str | None = None  # sbatch --partition
    account: str | None = None  # sbatch --account
    qos: str | None = None  # sbatch --qos
    time: str | None = None  # the job's time limit: "30" (minutes), "2:00:00", "2-00:00:00" (sbatch --time)
    sbatch_args: list[str] = Field(default_factory=list)  # more sbatch options, e.g. ["--mem=32G"]
    signal: str | None = None  # "INT@120": SIGINT 120 s before the time limit, to checkpoint (sbatch --signal)
    resubmit: bool = Field(False, description="a run the time limit's signal ended is requeued and goes on as the "
                                              "same experiment in a new allocation")

    _args = field_validator("sbatch_args")(classmethod(lambda cls, v: _sbatch_args(v)))
    _time = field_validator("time")(classmethod(lambda cls, v: _slurm_time(v)))
    _signal = field_validator("signal")(classmethod(lambda cls, v: _slurm_signal(v)))


class TargetSection(_Section):
    kind: Literal["local", "ssh", "proxmox", "group", "slurm"] = "local"
    root: str | None = None
    checkpoints: str | None = None
    python: str = "python3"
    host: str | None = None
    port: int | None = None
    user: str | None = None
    identity_file: str | None = None
    ct: int | None = Field(None, ge=100, le=999999999)
    access: Literal["ssh", "pct"] = "ssh"
    address: str | None = None
    members: list[str] = Field(default_factory=list)  # kind = "group": names of other targets; node 0 first
    gpus: int | None = Field(None, ge=1)  # the machine's GPU count (0..N-1) where nvidia-smi sees none; wins if both
    # kind = "slurm": host is the login node; these become sbatch's options (launch/slurm.py)
    partition: str | None = None  # kind = "slurm": the partition jobs are submitted to (sbatch --partition)
    account: str | None = None  # kind = "slurm": the account jobs are charged to (sbatch --account)
    qos: str | None = None  # kind = "slurm": the quality of service (sbatch --qos)
    time: str | None = None  # kind = "slurm": the job's time limit, "2-00:00:00" or "30:00" (sbatch --time)
    sbatch_args: list[str] = Field(default_factory=list)  # kind = "slurm": more sbatch options, e.g. ["--mem=32G"]
    signal: str | None = Field(None, description=(
        'kind = "slurm": "INT@120" sends the run SIGINT 120 s before its time limit, to checkpoint (sbatch --signal)'))
    resubmit: bool = Field(False, description='kind = "slurm": a run the time limit\'s signal ended is requeued and '
                                              "goes on as the same experiment in a new allocation")
    # each key of [slurm] a target names itself wins over the table's (``reach/targets.slurm_options``)

    _args = field_validator("sbatch_args")(classmethod(lambda cls, v: _sbatch_args(v)))
    _time = field_validator("time")(classmethod(lambda cls, v: _slurm_time(v)))
    _signal = field_validator("signal")(classmethod(lambda cls, v: _slurm_signal(v)))

    @model_validator(mode="after")
    def _kind_fields(self) -> "TargetSection":
        if self.kind == "group" and len(self.members) < 1:
            raise ValueError("a group target needs members = [\"name\", ...] (node 0 first)")
        if self.kind != "group" and self.members:
            raise ValueError("only a kind = \"group\" target has members")
        if self.kind == "ssh" and not self.host:
            raise ValueError("an ssh target needs host = \"...\"")
        if self.kind == "slurm" and not self.host:
            raise ValueError("a slurm target needs host = \"...\" (the cluster's login node)")
        slurm_only = [k for k in ("partition", "account", "qos", "time", "signal") if getattr(self, k) is not None]
        slurm_only += ["resubmit"] if self.resubmit else []
        if self.kind != "slurm" and (slurm_only or self.sbatch_args):
            raise ValueError(f"{(slurm_only or ['sbatch_args'])[0]} is for kind = \"slurm\" targets only")
        if self.kind == "proxmox" and self.ct is None:
            raise ValueError("a proxmox target needs ct = <CT id>")
        return self


class DistributedSection(_Section):
    """How a job over several nodes is launched (``orchestrator.launch.distributed``)."""

    launcher: Literal["torchrun", "none"] | None = None  # None: torchrun with more than one node
    nproc_per_node: Literal["auto"] | int = "auto"  # auto: the GPUs nvidia-smi lists on that node, else 1
    port: int = Field(29400, ge=1, le=65535)
    interface: str | None = None  # None: the interface that routes to node 0's address, on each node
    heartbeat_port: int | None = Field(None, ge=1, le=65535)  # None: port + 1 (UDP, between the supervisors)

    @property
    def heartbeat(self) -> int:
        """The UDP port the nodes' supervisors tell each other their progress on (stalls are the job's)."""
        if self.heartbeat_port is not None:
            return self.heartbeat_port
        return self.port + 1 if self.port < 65535 else self.port - 1

    @field_validator("nproc_per_node")
    @classmethod
    def _nproc(cls, v: object) -> object:
        if isinstance(v, int) and v < 1:
            raise ValueError("must be \"auto\" or a number of processes >= 1")
        return v


class NodeSsh(_Section):
    user: str = "root"
    host: str | None = None
    port: int | None = None


class ProxmoxSection(_Section):
    host: str
    port: int = 8006
    token_id: str
    token_file: str | None = None
    verify_ssl: bool | str = True
    timeout: float = Field(10.0, gt=0)
    start_timeout: float = Field(120.0, gt=0)
    cache_ttl: float = Field(30.0, ge=0, description="seconds a running CT's lookup (node, address) is reused by "
                                                      "the next commands; 0 asks the API every time")
    cache_max_age: float = Field(604800.0, ge=0, description="seconds an older lookup is still used to reach a "
                                 "CT whose port answers (every agent call checks that the machine there is that CT), "
                                 "asked again once the command has answered")
    node_ssh: NodeSsh = Field(default_factory=NodeSsh)

    @model_validator(mode="before")
    @classmethod
    def _host_port(cls, data: Any) -> Any:
        """``host = "pve1:8006"`` is host and port; a URL, or a port that disagrees with ``port``, is refused."""
        host = data.get("host") if isinstance(data, dict) else None
        if not isinstance(host, str):
            return data
        if "://" in host or "/" in host:
            raise ValueError(f"host = {host!r} is a URL: give the name or address alone (e.g. host = \"pve1.lan\"),"
                             " and port = N if the API does not listen on 8006")
        bracketed = host.startswith("[") and "]" in host  # [::1]:8006
        name, sep, port = host.rpartition(":") if bracketed or host.count(":") == 1 else (host, "", "")
        if not sep:
            return data
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"host = {host!r}: {port!r} is not a port (host = \"NAME\" or \"NAME:PORT\")")
        if "port" in data and str(data["port"]).strip() != str(int(port)):  # an ORCH_ variable's is text
            raise ValueError(f"host = {host!r} names port {port}, but port = {data['port']!r}: keep one")
        return {**data, "host": name.strip("[]") if bracketed else name, "port": int(port)}

    @field_validator("token_id")
    @classmethod
    def _token_id(cls, v: str) -> str:
        if "!" not in v or "@" not in v.split("!")[0]:
            raise ValueError("must look like USER@REALM!TOKENID, e.g. root@pam!orch")
        return v


class SshSection(_Section):
    config_file: str | None = None
    known_hosts: list[str] | None = None
    trust_file: str | None = None
    identity_file: str | None = None
    connect_timeout: float | None = Field(None, gt=0)  # None: ConnectTimeout from the SSH config, else 10 s
    command_timeout: float = Field(300.0, gt=0)
    read_timeout: float = Field(15.0, gt=0)  # status, logs (first read), checkpoints list: a frozen target fails fast
    keepalive: int = Field(5, ge=0)
    connect_retries: int = Field(2, ge=0, le=10)
    persist: float = Field(600.0, ge=0)  # s a connection keeper holds an idle connection; 0: connect per command


class PoolSection(_Section):
    """``[pools.NAME] members = ["gpu-a", 201]``: machines ``deploy --pool NAME --gpus N`` chooses among
    (target names, or CT ids)."""
    members: list[str | int] = Field(min_length=1)


class RunSection(_Section):
    stop_timeout: float = Field(30.0, ge=0, description="seconds to wait after SIGINT")
    term_timeout: float = Field(10.0, ge=0, description="seconds to wait after SIGTERM before SIGKILL")
    lock_timeout: float = Field(10.0, ge=0, description="seconds to wait for another operation on the target")
    registry_timeout: float = Field(30.0, ge=1, description="seconds to wait for another orch command's write to "
                                                          "the project's experiment registry")
    wait: float = Field(0.0, ge=0, description="after a launch, seconds to wait for the run's first metric line "
                                                "(or its end); 0 returns once it has started")
    restarts: int = Field(0, ge=0, le=1000, description="times a run that ended is relaunched: by its supervisor; "
                                                        "a job's, by torchrun on every node")
    restart_on: Literal["failure", "always"] = "failure"
    backoff: list[float] = Field(default_factory=lambda: [10.0, 30.0, 60.0],
                                 description="seconds before each restart; the last value repeats")
    stall_after: float | None = Field(None, gt=0, description="seconds without a new log line (a job: on any "
                                      "node) after which the run is stalled: stopped as a failure, so restarts apply")
    checkpoint_glob: str | None = Field(None, description="which entries of the checkpoint folder to resume from")
    resume_after_reboot: bool = False
    standby: bool = Field(True, description="keep the next run's supervisor started and waiting on the target, so a "
                                            "start waits for no Python start-up; false starts each one afresh")

    @field_validator("backoff")
    @classmethod
    def _backoff(cls, v: list[float]) -> list[float]:
        if not v or any(x < 0 for x in v):
            raise ValueError("must list at least one number of seconds, none negative, e.g. [10, 30, 60]")
        return v

    def recovery(self) -> dict:
        """What the on-target supervisor needs to restart a run by itself (``agent/run/attempts.Policy``)."""
        return {"restarts": self.restarts, "restart_on": self.restart_on, "backoff": list(self.backoff),
                "stall_timeout": self.stall_after, "term_timeout": self.term_timeout,  # the agent's name for it
                "checkpoint_glob": self.checkpoint_glob, "resume_after_reboot": self.resume_after_reboot}


class GuardSection(_Section):
    """``deploy --guard``: the new run is watched against the run it replaces, on the target."""

    steps: int = Field(200, ge=2, le=100_000_000, description="the watch window, in the run's own steps")
    min_throughput: float = Field(0.9, gt=0, le=100, description="the least throughput, as a fraction of the "
                                                                 "parent's over the same steps")
    max_loss_ratio: float | None = Field(None, gt=0, description="the most loss, as a multiple of the parent's "
                                                                 "at the same steps")
    on_fail: Literal["rollback", "stop"] = "rollback"
    loss: Literal["loss", "val_loss", "test_loss"] = Field("loss", description="the loss max_loss_ratio judges: the "
                                                           "training loss, or an evaluation's at the steps both "
                                                           "evaluated")

    def spec(self) -> dict:
        """What the guarded run's supervisor needs (``agent/watch/guard.Spec``), the runs' keys added by the launch."""
        return {"steps": self.steps, "min_throughput": self.min_throughput, "max_loss_ratio": self.max_loss_ratio,
                "on_fail": self.on_fail, "loss": self.loss}


class TrashSection(_Section):
    keep: int | None = Field(None, ge=1, description="keep at most this many trash entries (oldest purged)")
    max_gb: float | None = Field(None, gt=0, description="keep the trash under this size (oldest purged)")


class CheckpointsSection(_Section):
    ignore: list[str] = Field([".*", "*.tmp", "*.tmp-*"],
                              description="file name patterns (fnmatch) that are not checkpoints: hidden files and "
                                          "a training script's temporary files")


class MetricsSection(_Section):
    patterns: dict[str, str] = Field(default_factory=dict)
    # status flags the GPUs a run was given (--gpus) when all stay under 10% this long (seconds); None: never
    gpu_idle_after: float | None = Field(None, gt=0)


class EnvSection(_Section):
    """The run's Python environment, built on the target (``launch/envs.py``); unset: the target's own python."""

    requirements: str | None = None  # a requirements file beside orch.toml
    pyproject: bool = False  # the [project] dependencies of the project's own pyproject.toml
    lock: str | None = None  # a uv.lock (exported with uv on this machine)
    python: str | None = None  # "3.11": python3.11 on the target; None: the target's python
    system_site_packages: bool = False  # see what the image installed (a CUDA torch), beside the env's own
    wheels: Literal["auto", "push", "index"] = "auto"  # push: resolved here, sent, installed with no index
    installer: Literal["auto", "uv", "pip"] = "auto"  # auto: uv when the target has it, else venv + pip
    build_timeout: float = Field(3600.0, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> "EnvSection":
        named = [k for k in ("requirements", "lock") if getattr(self, k)] + (["pyproject"] if self.pyproject else [])
        if len(named) > 1:
            raise ValueError(f"name one source of requirements, not {' and '.join(named)}")
        return self

    @property
    def active(self) -> bool:
        return bool(self.requirements or self.pyproject or self.lock)


class MlflowSection(_Section):
    """``orch experiments export --mlflow`` and the mirror (``watch/mlflow_export.py``)."""
    tracking_uri: str | None = None  # else MLFLOW_TRACKING_URI, else sqlite:///<.orch>/mlflow.db
    experiment: str | None = None  # the MLflow experiment the runs go to; default: [project] name
    mirror: bool = False  # every command that changes an experiment's record mirrors it

    @field_validator("tracking_uri")
    @classmethod
    def _no_password(cls, v: str | None) -> str | None:
        from urllib.parse import urlsplit

        from pydantic_core import PydanticCustomError

        if v is not None and urlsplit(v).password is not None:
            raise PydanticCustomError(SECRET_VALUE, "holds a password, and settings are recorded with every "
                                      "experiment: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD in "
                                      "the environment instead")
        return v


def local_root() -> str:
    """The built-in local target's root: the user's own data folder, never a shared one like /tmp.

    ``$XDG_DATA_HOME/orch/local``, else ``~/.local/share/orch/local``.
    """
    data = os.environ.get("XDG_DATA_HOME", "")
    if not os.path.isabs(data):  # the XDG spec: a relative value is ignored
        data = os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(data, "orch", "local")


SECRET_KEYS = ("notify.url",)  # never shown in an error: the value is a secret
NOTIFY_EVENTS = ("crashed", "stalled", "restarted", "finished", "spike", "slow")  # those the supervisor sends (agent/watch/notify.py)


class NotifySection(_Section):
    """Webhook notifications sent by the target's supervisor; the URL is a secret, never recorded."""

    url: str | None = Field(None, exclude=True, repr=False, description="the webhook URL (never recorded)")
    url_secret: str | None = Field(None, description="name of the secret (environment or .orch/secrets.env) "
                                                     "holding the webhook URL")
    format: Literal["slack", "discord", "ntfy", "json"] = "json"
    on: list[str] = Field(default_factory=lambda: ["crashed", "stalled"])

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        from .agent.watch.notify import url_fault

        fault = url_fault(v) if v is not None else None
        if fault:
            raise ValueError(fault)  # never echo the value: it is a secret
        return v

    @field_validator("url_secret")
    @classmethod
    def _url_secret(cls, v: str | None) -> str | None:
        import re

        if v is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
            raise ValueError(f"{v!r} is not an environment variable name (letters, digits, '_')")
        return v

    @field_validator("on")
    @classmethod
    def _on(cls, v: list[str]) -> list[str]:
        unknown = [e for e in v if e not in NOTIFY_EVENTS]
        if unknown:
            raise ValueError(f"{', '.join(map(repr, unknown))} is not an event orch sends; "
                             f"choose among {', '.join(NOTIFY_EVENTS)}")
        return list(dict.fromkeys(v))

    @model_validator(mode="after")
    def _one_url(self) -> "NotifySection":
        if self.url is not None and self.url_secret is not None:
            raise ValueError("set url or url_secret, not both")
        return self

    @property
    def enabled(self) -> bool:
        return self.url is not None or self.url_secret is not None


class Settings(_Section):
    project: ProjectSection = Field(default_factory=ProjectSection)
    paths: PathsSection = Field(default_factory=PathsSection)
    batching: BatchingSection = Field(default_factory=BatchingSection)
    targets: dict[str, TargetSection] = Field(default_factory=dict)
    default_target: str = "local"
    proxmox: ProxmoxSection | None = None
    ssh: SshSection = Field(default_factory=SshSection)
    run: RunSection = Field(default_factory=RunSection)
    guard: GuardSection = Field(default_factory=GuardSection)
    trash: TrashSection = Field(default_factory=TrashSection)
    checkpoints: CheckpointsSection = Field(default_factory=CheckpointsSection)
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    distributed: DistributedSection = Field(default_factory=DistributedSection)
    slurm: SlurmSection = Field(default_factory=SlurmSection)
    notify: NotifySection = Field(default_factory=NotifySection)
    pools: dict[str, PoolSection] = Field(default_factory=dict)
    env: EnvSection = Field(default_factory=EnvSection)
    mlflow: MlflowSection = Field(default_factory=MlflowSection)

    _config_path: Path | None = PrivateAttr(default=None)
    _project_dir: Path = PrivateAttr(default_factory=Path.cwd)

    @field_validator("default_target")
    @classmethod
    def _default_target(cls, v: str, info: ValidationInfo) -> str:
        # a key of its own (not the whole model's) in an error, so that a forgiving read can put it right alone
        targets = info.data.get("targets")
        if targets is not None and v != "local" and v not in targets:
            raise ValueError(f"is not one of the [targets] ({', '.join(sorted({*targets, 'local'}))})")
        return v

    @model_validator(mode="after")
    def _builtin_local(self) -> "Settings":
        if "local" not in self.targets:
            root = local_root()
            self.targets["local"] = TargetSection(kind="local", root=root, checkpoints=root + "/checkpoints/{project}")
        for name, spec in self.targets.items():
            unknown = [m for m in spec.members if m not in self.targets or self.targets[m].kind == "group"]
            if unknown:
                raise ValueError(f"targets.{name}.members: {', '.join(unknown)} is not a single target "
                                 f"(configured: {', '.join(sorted(self.targets))})")
        for name, pool in self.pools.items():
            unknown = [str(m) for m in pool.members if isinstance(m, str) and
                       (m not in self.targets or self.targets[m].kind == "group")]
            if unknown:
                raise ValueError(f"pools.{name}.members: {', '.join(unknown)} is not a single target "
                                 f"(configured: {', '.join(sorted(self.targets))}); a CT id is a number")
        return self

    @property
    def config_path(self) -> Path | None:
        return self._config_path

    @property
    def project_dir(self) -> Path:
        return self._project_dir

    @property
    def state_dir(self) -> Path:
        """Where the controller keeps its records: ``.orch/`` beside orch.toml."""
        return self._project_dir / ".orch"


def find_config(start: Path | None = None) -> Path | None:
    """The nearest orch.toml at or above ``start`` (default: the working directory)."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / CONFIG_NAME
        if candidate.is_file():
            return candidate
    return None


CONFIG_MAX = 1 << 20  # an orch.toml is a few KiB: anything past this is not one (/dev/zero, /proc/kcore)


def _read_config(path: Path, named_by: str | None) -> str:
    """The text of the config file at ``path``; what is not a readable regular file is a ``ConfigError``.

    The file is opened without blocking and checked on the open descriptor, so a FIFO never hangs orch and a
    path swapped for a device after a check is still refused; ``named_by`` is the flag or variable that named it.
    """
    import stat

    how = " (named by ORCH_CONFIG)" if named_by == "ORCH_CONFIG" else ""

    def naming(value: object) -> str:
        return f"set ORCH_CONFIG={value}" if named_by == "ORCH_CONFIG" else f"pass --config {value}"

    hint = f"{naming('PATH')} of an orch.toml file, or run `orch init` to write one"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"config file {path}{how} does not exist", hint="run `orch init` or pass --config PATH") \
            from None
    except OSError as exc:
        raise ConfigError(f"config file {path}{how} cannot be opened: {exc.strerror}", hint=hint) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError(f"config file {path}{how} is a folder, not a file",
                              hint=f"{naming(path / CONFIG_NAME)} (the orch.toml inside it)")
        if not stat.S_ISREG(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a file")
            raise ConfigError(f"config file {path}{how} is {kind}, not a regular file", hint=hint)
        chunks, size = [], 0
        while size <= CONFIG_MAX:
            try:
                chunk = os.read(fd, 1 << 16)
            except OSError as exc:
                raise ConfigError(f"config file {path}{how} cannot be read: {exc.strerror}", hint=hint) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > CONFIG_MAX:
            raise ConfigError(f"config file {path}{how} is larger than {CONFIG_MAX >> 20} MiB: not an orch.toml",
                              hint=hint)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8")


def _parse_value(text: str) -> Any:
    """A --set / environment value: a TOML value when it parses as one, else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _assign(data: dict, dotted: str, value: Any, source: str, sources: dict[str, str]) -> None:
    parts = [p for p in dotted.split(".")]
    if not dotted or any(not p for p in parts):
        raise ConfigError(f"{source}: {dotted!r} is not a dotted key", hint="use e.g. --set batching.strategy=shuffle")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{source}: {'.'.join(parts[:-1])} is not a section")
        node = child
    node[parts[-1]] = value
    sources[dotted] = source


def _shown(dotted: str) -> str:
    section, _, key = dotted.rpartition(".")
    return f"[{section}] {key}"


def _take(data: dict, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a ``section.key``, removed from ``data``."""
    section, _, key = dotted.rpartition(".")
    node = data.get(section)
    if not isinstance(node, dict) or key not in node:
        return False, None
    return True, node.pop(key)


def _layer(source: str) -> int:
    """0: the file, 1: an environment variable, 2: a --set flag (the precedence)."""
    return 2 if source.startswith("--set") else 1 if source.startswith("environment variable") else 0


def _renamed(data: dict, sources: dict[str, str], label: str, notice: Callable[[str], None]) -> None:
    """Read each old key of ``RENAMED`` as its new one. Both in one layer with different values are an error;
    across layers the higher one wins, as for any key."""
    for old, (new, changed) in RENAMED.items():
        found, value = _take(data, old)
        if not found:
            continue
        where, there = sources.get(old, label), sources.get(new, label)
        section, _, key = new.rpartition(".")
        node = data.get(section) if isinstance(data.get(section), dict) else {}
        if key in node and node[key] != value and _layer(where) == _layer(there):
            raise ConfigError(f"{where}: {_shown(old)} = {value!r} and {_shown(new)} = {node[key]!r} disagree "
                              f"({_shown(old)} is the old name of {_shown(new)})", hint=f"keep only {_shown(new)}")
        if key not in node or _layer(where) > _layer(there):
            _assign(data, new, value, where, sources)
        notice(f"orch: warning: {where}: {_shown(old)} is now {_shown(new)}{changed} (read as {key} = {value!r}); "
               "rename it")


def recorded_as_now(config: dict) -> dict:
    """An experiment's recorded settings under today's key names (a record from before a rename holds both the
    old keys it was launched with and their defaults: the first old key of ``RENAMED`` wins, silently)."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in (config or {}).items()}
    for old, (new, _changed) in RENAMED.items():
        found, value = _take(data, old)
        section, _, key = new.rpartition(".")
        if found and isinstance(data.setdefault(section, {}), dict):
            data[section].setdefault(key, value)
    return data


def _env_overrides(env: dict[str, str]) -> list[tuple[str, str, str]]:
    out = []
    for name, value in sorted(env.items()):
        if name.startswith(ENV_PREFIX) and "__" in name:
            dotted = name[len(ENV_PREFIX):].lower().replace("__", ".")
            out.append((dotted, value, f"environment variable {name}"))
    return out


def _describe(err: dict, data: dict, sources: dict[str, str], file_label: str) -> str:
    loc = [str(p) for p in err["loc"]]
    dotted = ".".join(loc)
    candidates = [dotted, *[".".join(loc[:i]) for i in range(len(loc) - 1, 0, -1)]]
    candidates += sorted(k for k in sources if k.startswith(dotted + "."))
    source = next((sources[k] for k in candidates if k in sources), file_label)
    if err["type"] == "extra_forbidden":
        section = _model_at(loc[:-1])
        allowed = ", ".join(sorted(section.model_fields)) if section else "?"
        return f"{source}: unknown key {dotted!r} (allowed here: {allowed})"
    value = err.get("input")
    secret = dotted in SECRET_KEYS or err["type"] == SECRET_VALUE
    shown = "" if isinstance(value, dict) or value is None or secret else f" = {value!r}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{source}: {dotted or 'settings'}{shown}: {msg}"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The section model at a location, for listing the keys allowed there."""
    model: type[BaseModel] | None = Settings
    i = 0
    while i < len(loc) and model is not None:
        if model is Settings and loc[i] == "targets":
            model, i = (TargetSection if i + 1 < len(loc) else None), i + 2
            continue
        field = model.model_fields.get(loc[i])
        if field is None:
            return None
        args = getattr(field.annotation, "__args__", (field.annotation,))
        model = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        i += 1
    return model


def _without_errors(data: dict, exc: ValidationError, instead: dict[str, Any], tries: int = 8) -> Settings | None:
    """The settings with every key in error dropped (its default reads instead, or the value ``instead`` holds for
    it); a key whose section cannot stand without it takes the section with it. None when nothing is left to drop."""
    for _ in range(tries):
        for err in exc.errors():
            loc = [str(p) for p in err["loc"]]
            if ".".join(loc) in instead and data.get(loc[0]) != instead[".".join(loc)]:
                data[loc[0]] = instead[".".join(loc)]
                continue
            while loc and not _drop(data, loc):
                loc = loc[:-1]
            if not loc:
                return None
        try:
            return Settings.model_validate(data)
        except ValidationError as again:
            exc = again
    return None


def _drop(data: dict, loc: list[str]) -> bool:
    """Remove the key at ``loc`` from ``data``; whether it was there."""
    node: Any = data
    for part in loc[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


SYNTAX_HINT = "fix the syntax there; `orch init --print` shows a commented starter orch.toml"
REFUSED = "(deploy, restart, sweep and queue refuse it until it is fixed)"


class Recorded(NamedTuple):
    """The settings an experiment was launched with, for reading a project whose orch.toml cannot be read."""

    experiment: int
    config: dict  # as recorded (``recorded_as_now`` reads it under today's names)
    target: str  # the target it ran on


def load_settings(config_path: Path | str | None = None, *, overrides: list[str] | tuple[str, ...] = (),
                  env: dict[str, str] | None = None, start: Path | None = None,
                  notice: Callable[[str], None] | None = None, lenient: bool = False,
                  recorded: Callable[[Path], Recorded | None] | None = None) -> Settings:
    """Merge every layer and validate once; raise ``ConfigError`` naming source, key and value.

    An old key (``RENAMED``) is read as its new one and ``notice`` (default: stderr) told so. ``lenient`` (for
    the commands that only look or stop: no mistake in orch.toml may keep a user from stopping a run): each key in
    error is left at its default (its section, when the section cannot stand without it) and ``notice`` told which;
    an unknown ``default_target`` reads as the target the newest experiment ran on, and a file that cannot be read
    or parsed as the settings that experiment was launched with. ``recorded(state_dir)`` gives them (the registry
    is above this module)."""
    env = dict(os.environ) if env is None else env
    notice = notice or (lambda line: print(line, file=sys.stderr, flush=True))
    named_by = "--config"
    if config_path is None and env.get("ORCH_CONFIG"):
        config_path, named_by = env["ORCH_CONFIG"], "ORCH_CONFIG"
    path = Path(config_path).expanduser() if config_path else find_config(start)
    project_dir = path.resolve().parent if path else (start or Path.cwd()).resolve()
    last: list[Recorded | None] = []  # asked of the registry once, and only when orch.toml is in error

    def newest() -> Recorded | None:
        if not last:
            last.append(recorded(project_dir / ".orch") if recorded else None)
        return last[0]

    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    label = "built-in defaults"
    if path is not None:
        label = str(path)
        try:
            data = tomllib.loads(_read_config(path, named_by if config_path else None))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError, ConfigError) as exc:
            broken = exc if isinstance(exc, ConfigError) else \
                ConfigError(f"{path}: not valid TOML: {exc}", hint=SYNTAX_HINT)
            # read past only a file that is there and, when it cannot be read at all, beside a project's records:
            # one missing, a folder or /proc/self/mem names no project to act on
            if not lenient or not path.is_file() or (broken is exc and not (project_dir / ".orch").is_dir()):
                raise broken from None
            data = _instead_of_file(broken, newest(), notice)
    for dotted, value, source in _env_overrides(env):
        _assign(data, dotted, _parse_value(value), source, sources)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r} needs the form section.key=value", hint="e.g. --set batching.seed=3")
        dotted, value = item.split("=", 1)
        _assign(data, dotted.strip(), _parse_value(value.strip()), f"--set {dotted.strip()}", sources)
    try:
        _renamed(data, sources, label, notice)
    except ConfigError as exc:  # an old and a new name that disagree: the new one is read (the old one is dropped)
        if not lenient:
            raise
        notice(f"orch: warning: {exc.message}; read as the new name says\n  {REFUSED}")
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        lines = [_describe(e, data, sources, label) for e in exc.errors()]
        instead: dict[str, Any] = {}
        ran = newest() if lenient else None
        if ran is not None and any(tuple(e["loc"]) == ("default_target",) for e in exc.errors()) and \
                (ran.target == "local" or ran.target in (data.get("targets") or {})):
            instead["default_target"] = ran.target
            lines.append(f"(default_target read as {ran.target!r}: experiment {ran.experiment} ran there)")
        settings = _without_errors(data, exc, instead) if lenient else None
        if settings is None and lenient:  # nothing left to drop (a whole-file rule): as the run was launched
            settings = _recorded_settings(ran) if ran is not None else None
            lines.append(f"(read as experiment {ran.experiment} was launched)" if settings is not None
                         else "(read with the built-in defaults)")
            settings = settings or Settings()
        if settings is None:
            raise ConfigError("invalid configuration:\n  " + "\n  ".join(lines),
                              hint="fix the value(s) above (`orch init --print` shows a commented starter "
                                   "orch.toml)") from None
        notice("orch: warning: invalid configuration, read without it:\n  " + "\n  ".join(lines) + "\n  " + REFUSED)
    settings._config_path = path.resolve() if path else None
    settings._project_dir = project_dir
    return settings


def _instead_of_file(broken: ConfigError, ran: Recorded | None, notice: Callable[[str], None]) -> dict:
    """What a forgiving read takes for a file it cannot read: the newest experiment's recorded settings (its
    targets, project name and roots are what the run on the target was started with), else the defaults."""
    how = (f"read with the settings experiment {ran.experiment} was launched with" if ran is not None
           else "read with the built-in defaults")
    notice(f"orch: warning: {broken.message}\n  ({how}) {REFUSED}")
    return recorded_as_now(ran.config) if ran is not None else {}


def _recorded_settings(ran: Recorded) -> Settings | None:
    try:
        return Settings.model_validate(recorded_as_now(ran.config))
    except ValidationError:
        return None
