"""Daemon and CLI settings, from four sources in this precedence:

    CLI flags (a dict) > environment (FLINK_RECONCILER_*) > YAML config file (--config) > defaults

Secrets are `SecretStr` and may also come from a file named by `FLINK_RECONCILER_<NAME>_FILE` (the way
Kubernetes mounts Secrets), so they never have to sit in the environment or the config file. They are
never printed: use `Settings.redacted()` for logs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from reconciler.errors import ConfigError

ENV_PREFIX = "FLINK_RECONCILER_"
CONFIG_ENV = ENV_PREFIX + "CONFIG"
REDACTED = "**********"

_DURATION = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*(ms|s|m|h)?[ \t]*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> object:
    """Accept 15, 15.0, "15", "15s", "500ms", "2m", "1h"; leave anything else for pydantic to reject."""
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if not m:
            raise ValueError(f"not a duration: {value!r} (examples: 15, 15s, 500ms, 2m, 1h)")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return value


def _upper(value: object) -> object:
    return value.upper() if isinstance(value, str) else value


Duration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0, le=86400 * 365, allow_inf_nan=False)]


class Settings(BaseSettings):
    """Everything the daemon and the CLI can be told. Field descriptions feed docs/daemon.md."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="forbid",
        frozen=True,
        env_ignore_empty=True,
        validate_default=True,
    )

    # --- source -----------------------------------------------------------------------------------
    repo_url: str | None = Field(None, description="Git URL of the GitOps repository (required by `run`).")
    branch: str = Field("main", description="Branch to follow.")
    path: str = Field("", description="Sub-directory of the repository holding the app specs.")
    git_token: SecretStr | None = Field(None, description="HTTPS token for Git (secret).")
    git_ssh_key_path: Path | None = Field(None, description="SSH private key file for Git.")
    # --- reconciling ------------------------------------------------------------------------------
    state_dir: Path = Field(Path(".state"), description=(
        "Records of the local runtime (`records/`), its clusters and savepoints, the Git cache and the daemon "
        "lock live here. On Kubernetes the records are ConfigMaps (see [state.md](state.md)); the state dir "
        "is only a cache."))
    runtime: Literal["local", "kubernetes"] = Field("local", description="Where Flink runs.")
    dry_run: bool = Field(False, description="No runtime: observe an empty runtime and plan only.")
    poll_interval: Duration = Field(15.0, description="Seconds between Git fetches (also `15s`, `2m`).")
    drift_interval: Duration = Field(60.0, description="Seconds between full passes over every app (drift).")
    max_parallel: int = Field(4, ge=1, description="Apps reconciled at the same time.")
    prune: bool = Field(False, description="Delete apps whose spec was removed from Git.")
    spec_policy: Literal["restricted", "permissive"] = Field(
        "restricted", description="What a spec may ask of the cluster and of this host: `restricted` refuses "
        "host namespaces, privileged containers, hostPath, host ports, jars from loopback, link-local or "
        "cloud-metadata addresses (docs/security.md); `permissive` allows them.",
    )
    mass_delete_threshold: float = Field(
        0.5, gt=0, le=1, description="Refuse to prune when more than this fraction of apps vanished at once."
    )
    mass_delete_min_apps: int = Field(
        3, ge=0, description="The mass-deletion guard only fires when at least this many apps would go."
    )
    repair_max_attempts: int = Field(
        5, ge=1, le=1000, description="Self-healing: automatic repairs of one spec within repair_window before the "
        "app is failed as a crash loop (no more restarts until Git changes it or restartNonce is bumped).",
    )
    repair_window: Duration = Field(600.0, description="Self-healing: the crash-loop window (also `10m`).")
    repair_backoff: Duration = Field(
        10.0, description="Self-healing: the wait before a second repair of the same spec; it doubles with each one "
        "after, up to 5 minutes (also `10s`).",
    )
    shutdown_deadline: Duration = Field(
        25.0, description="Seconds SIGTERM allows to finish or park the current step before exiting."
    )
    # --- HTTP -------------------------------------------------------------------------------------
    listen_host: str = Field("127.0.0.1", description="Address of the public port: webhooks and the dashboard.")
    listen_port: int = Field(8080, ge=0, le=65535, description="The public port (0: any free port).")
    github_webhook_secret: SecretStr | None = Field(None, description="GitHub webhook secret (secret).")
    gitlab_webhook_token: SecretStr | None = Field(None, description="GitLab webhook secret token (secret).")
    gitea_webhook_secret: SecretStr | None = Field(None, description="Gitea webhook secret (secret).")
    probe_host: str | None = Field(None, description=(
        "Address of the probe listener: `/healthz`, `/readyz` and `/metrics` on a port of their own, apart from "
        "the webhooks and the dashboard (default: `listen_host`)."))
    probe_port: int = Field(8081, ge=0, le=65535, description="Port of the probe listener (0: any free port).")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field((), description=(
        "Host names the public port answers besides `localhost`, `127.0.0.1`, `[::1]` and `listen_host`, "
        "comma-separated (the names browsers and forges use: an Ingress host, the Service's DNS names); any "
        "other Host gets 421, against DNS rebinding. `*`: any Host. `/webhook` is exempt (its signature guards "
        "it)."))
    max_connections_per_client: int = Field(32, ge=1, le=10000, description=(
        "Connections one client address may hold open on the public port; one more gets 503."))
    webhook_enabled: bool = Field(True, description=(
        "Serve `POST /webhook`. On an address other than loopback it needs a forge secret (the daemon refuses to "
        "start without one)."))
    insecure_ui: bool = Field(False, description=(
        "Serve the dashboard on an address other than loopback without `ui_auth` (refused otherwise)."))
    ui_enabled: bool = Field(True, description=(
        "Serve the read-only web dashboard ([ui.md](ui.md)) on this port: `/` for a browser (plain text for "
        "anything else, and always at `/status.txt`), `/apps/<name>`, `/plan`."))
    ui_auth: SecretStr | None = Field(None, description=(
        "Who may see the dashboard: `bearer:<token>` (an `Authorization: Bearer` header, or the browser's "
        "basic-auth prompt with the token as password) or `basic-file:<path>` (a file of `user:password` lines); "
        "unset: anyone who reaches the port, which is refused on an address other than loopback unless "
        "`insecure_ui` (secret)."))
    # --- commit status ----------------------------------------------------------------------------
    status_sink: Literal["notes", "github", "gitlab", "gitea", "none"] = Field(
        "notes", description="Where commit statuses go: git notes, a forge's status API, or nowhere."
    )
    forge_api_url: str | None = Field(
        None,
        description="GitHub: API URL (default `https://api.github.com`; GHE: `https://HOST/api/v3`). "
        "GitLab, Gitea: the instance URL (GitLab default `https://gitlab.com`; Gitea: required).",
    )
    forge_token: SecretStr | None = Field(None, description="Forge API token for commit statuses (secret).")
    forge_repo: str | None = Field(None, description="Forge repository: `owner/name` (GitLab: project path or id).")
    status_target_url: str | None = Field(None, description="Link put on commit statuses (this daemon's `/`).")
    # --- logging ----------------------------------------------------------------------------------
    log_format: Literal["text", "json"] = Field("text", description="`text` or `json` lines on stderr.")
    log_level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR"], BeforeValidator(_upper)] = Field(
        "INFO", description="Minimum log level."
    )
    # --- kubernetes runtime -----------------------------------------------------------------------
    kubeconfig: Path | None = Field(None, description="Kubeconfig file (default: in-cluster, then ~/.kube/config).")
    namespaces: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Namespaces to manage, comma-separated (empty: the current namespace)."
    )
    rest_via: Literal["service", "proxy"] = Field(
        "service", description="Reach JobManagers via their Service (in cluster) or the API server proxy."
    )
    leader_election: bool = Field(
        False, description="kubernetes: reconcile only while holding a coordination.k8s.io Lease (replicas >= 2)."
    )
    lease_name: str = Field("flink-reconciler", description="Name of that Lease.")
    lease_namespace: str | None = Field(
        None, description="Namespace of the Lease (default: $POD_NAMESPACE, else the first managed namespace)."
    )
    # --- sharding ---------------------------------------------------------------------------------
    shards: int = Field(
        1, ge=1, le=1024, description="Split the apps over this many shards, one daemon (or replica set) each: "
        "an app belongs to shard `sha256(name) mod shards`, whatever its file or namespace.",
    )
    shard: int | Literal["auto"] = Field(
        0, description="The shard this daemon reconciles (0 .. shards-1). With leader election its Lease "
        "is `<lease_name>-shard-<shard>`, so each shard has its own leader. `auto` (kubernetes, `run`): replicas "
        "share the shards through those Leases, each holding at most ceil(shards / live replicas).",
    )

    @field_validator("namespaces", "allowed_hosts", mode="before")
    @classmethod
    def _split_namespaces(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("state_dir")
    @classmethod
    def _usable_state_dir(cls, value: Path) -> Path:
        """A state dir that is a file (or under one) fails here, with its name, not later in a traceback.
        Made absolute: Flink's JVMs run in directories of their own, so a relative `--state-dir demo/state`
        (as the README types it) would name another place for them."""
        path = value.expanduser().absolute()
        for p in (path, *path.absolute().parents):
            if p.exists() or p.is_symlink():
                if not p.is_dir():
                    raise ValueError(f"{p} is not a directory" + ("" if p == path else f" (on the way to {path})"))
                break
        return path

    @field_validator("path")
    @classmethod
    def _relative_path(cls, value: str) -> str:
        value = value.strip().strip("/")
        if any(part == ".." for part in value.split("/")):
            raise ValueError("must stay inside the repository (no '..')")
        return value

    @field_validator(
        "github_webhook_secret", "gitlab_webhook_token", "gitea_webhook_secret", "git_token", "forge_token",
        "ui_auth",
    )
    @classmethod
    def _empty_secret_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        return None if value is not None and not value.get_secret_value() else value

    @model_validator(mode="after")
    def _shard_in_range(self) -> Settings:
        if self.shard == "auto":
            return self
        if self.shard < 0 or self.shard >= self.shards:
            raise ValueError(f"shard {self.shard} does not exist: shards are numbered 0 .. {self.shards - 1}")
        return self

    @property
    def shard_lease_name(self) -> str:
        """The Lease of this daemon's shard: one leader per shard, however many replicas each shard has."""
        if self.shard == "auto":  # only `run` takes shards; a one-off command holds none of their Leases
            raise ConfigError("shard: auto: only the daemon (`run`) takes shard Leases; give a one-off command "
                              "leader_election: false, or shard: <i> to act as that shard's leader")
        return self.lease_name if self.shards == 1 else f"{self.lease_name}-shard-{self.shard}"

    @model_validator(mode="after")
    def _forge_complete(self) -> Settings:
        if self.status_sink in ("github", "gitlab", "gitea"):
            missing = [n for n in ("forge_token", "forge_repo") if getattr(self, n) is None]
            if self.status_sink == "gitea" and not self.forge_api_url:
                missing.append("forge_api_url")
            if missing:
                raise ValueError(f"status_sink={self.status_sink} needs " + ", ".join(missing))
        return self

    @property
    def forge_api_base(self) -> str | None:
        """forge_api_url with the public default for GitHub (API URL) and GitLab (instance URL)."""
        if self.forge_api_url:
            return self.forge_api_url.rstrip("/")
        return {"github": "https://api.github.com", "gitlab": "https://gitlab.com"}.get(self.status_sink)

    def redacted(self) -> dict[str, Any]:
        """Every setting, printable: secrets masked, credentials in URLs removed (for the startup log)."""
        out: dict[str, Any] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, SecretStr):
                out[name] = REDACTED
            elif isinstance(value, Path):
                out[name] = str(value)
            elif isinstance(value, tuple):
                out[name] = list(value)
            elif isinstance(value, str) and name.endswith("_url"):
                out[name] = redact_url(value)
            else:
                out[name] = value
        return out

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        # repr() must not leak a token embedded in repo_url either.
        yield from self.redacted().items()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            _SecretFileSource(settings_cls),
            _YamlFileSource(settings_cls, _config_file.get()),
        )


_config_file: ContextVar[Path | None] = ContextVar("flink_reconciler_config_file", default=None)


def secret_fields() -> list[str]:
    return [n for n, f in Settings.model_fields.items() if _is_secret(f)]


def _is_secret(field: FieldInfo) -> bool:
    return "SecretStr" in str(field.annotation)


class _SecretFileSource(PydanticBaseSettingsSource):
    """`FLINK_RECONCILER_<SECRET>_FILE=/path`: read the secret from that file (trailing newline dropped)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        env = {k.upper(): v for k, v in os.environ.items()}
        out: dict[str, Any] = {}
        for name in secret_fields():
            file_var = f"{ENV_PREFIX}{name.upper()}_FILE"
            file_name = env.get(file_var)
            if not file_name:
                continue
            if env.get(f"{ENV_PREFIX}{name.upper()}"):
                raise ConfigError(f"both {ENV_PREFIX}{name.upper()} and {file_var} are set; use one")
            try:
                text = Path(file_name).read_text(encoding="utf-8")
            except OSError as e:
                raise ConfigError(f"{file_var}: cannot read {file_name}: {e.strerror}") from e
            text = text.rstrip("\r\n")
            if not text:
                raise ConfigError(f"{file_var}: {file_name} is empty")
            out[name] = text
        return out


class _YamlFileSource(PydanticBaseSettingsSource):
    """A flat YAML mapping of setting names (dashes or underscores) to values."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self._path = path

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if self._path is None:
            return {}
        try:
            text = self._path.read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"config file {self._path}: {e.strerror}") from e
        try:
            data = YAML(typ="safe", pure=True).load(text)
        except YAMLError as e:
            raise ConfigError(f"config file {self._path}: not valid YAML: {e}") from e
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError(f"config file {self._path}: must be a mapping of setting names to values")
        return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_settings(cli: Mapping[str, Any] | None = None, config_file: Path | str | None = None) -> Settings:
    """Build Settings from all sources. CLI values of None (flags not given) are ignored.

    The config file defaults to $FLINK_RECONCILER_CONFIG. Raises ConfigError with every problem listed
    (field, where to set it, what is wrong) and never the offending value, which may be a secret.
    """
    given = {k.replace("-", "_"): v for k, v in (cli or {}).items() if v is not None}
    path = config_file if config_file is not None else os.environ.get(CONFIG_ENV) or None
    token = _config_file.set(Path(path) if path is not None else None)
    try:
        return Settings(**given)
    except ValidationError as e:
        problems = []
        for err in e.errors(include_input=False, include_url=False):
            loc = ".".join(str(p) for p in err["loc"]) or "settings"
            hint = f" ({ENV_PREFIX}{loc.upper()})" if loc in Settings.model_fields else ""
            problems.append(f"{loc}{hint}: {err['msg']}")
        raise ConfigError("invalid settings:\n  " + "\n  ".join(problems)) from None
    finally:
        _config_file.reset(token)


def redact_url(url: str) -> str:
    """Drop a password or token embedded in a URL (https://user:token@host/...)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None and not (parts.username and parts.scheme in ("http", "https")):
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, f"{REDACTED}@{host}", parts.path, parts.query, parts.fragment))


def reference() -> Iterator[tuple[str, str, str, str]]:
    """(setting, environment variable, default, description) for every setting, for the docs."""
    for name, field in Settings.model_fields.items():
        env = ENV_PREFIX + name.upper()
        if _is_secret(field):
            env += f" / {env}_FILE"
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(default)
        shown = "" if default is None else str(default).lower() if isinstance(default, bool) else str(default)
        yield name, env, shown, field.description or ""


def reference_markdown() -> str:
    rows = ["| setting | environment | default | meaning |", "| --- | --- | --- | --- |"]
    for name, env, default, description in reference():
        rows.append(f"| `{name}` | `{env}` | {f'`{default}`' if default else ''} | {description} |")
    return "\n".join(rows) + "\n"
