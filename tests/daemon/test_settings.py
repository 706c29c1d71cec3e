"""Settings: precedence of the four sources, *_FILE secrets, validation messages, redaction."""

from __future__ import annotations

from pathlib import Path

import pytest

from reconciler.errors import ConfigError
from reconciler.redaction import REDACTED as URL_REDACTED
from reconciler.settings import REDACTED, load_settings, redact_url, reference_markdown, secret_fields

DOCS = Path(__file__).resolve().parents[2] / "docs" / "daemon.md"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_relative_state_dir_is_taken_from_where_the_command_runs(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`--state-dir demo/state`, as the README types it: the Flink JVMs of the local runtime run in
    directories of their own, so the path they get must not be relative."""
    monkeypatch.chdir(tmp_path)
    s = load_settings({"state_dir": "demo/state"})
    assert s.state_dir == tmp_path / "demo" / "state"


def test_defaults() -> None:
    s = load_settings()
    assert (s.branch, s.path, s.state_dir, s.runtime) == ("main", "", Path(".state").absolute(), "local")
    assert (s.poll_interval, s.drift_interval, s.max_parallel, s.prune) == (15.0, 60.0, 4, False)
    assert (s.mass_delete_threshold, s.mass_delete_min_apps) == (0.5, 3)
    assert (s.listen_host, s.listen_port) == ("127.0.0.1", 8080)
    assert (s.status_sink, s.log_format, s.log_level, s.dry_run) == ("notes", "text", "INFO", False)
    assert (s.rest_via, s.namespaces, s.kubeconfig) == ("service", (), None)
    assert s.github_webhook_secret is None


def test_precedence_cli_over_env_over_file_over_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(
        tmp_path / "config.yaml",
        "branch: from-file\npoll-interval: 30s\nmax_parallel: 2\nprune: true\nnamespaces: [a, b]\n",
    )
    s = load_settings(config_file=config)
    assert (s.branch, s.poll_interval, s.max_parallel, s.prune, s.namespaces) == (
        "from-file",
        30.0,
        2,
        True,
        ("a", "b"),
    )

    monkeypatch.setenv("FLINK_RECONCILER_BRANCH", "from-env")
    monkeypatch.setenv("FLINK_RECONCILER_MAX_PARALLEL", "8")
    monkeypatch.setenv("FLINK_RECONCILER_NAMESPACES", "flink, team-b ,")
    s = load_settings(config_file=config)
    assert (s.branch, s.poll_interval, s.max_parallel, s.namespaces) == ("from-env", 30.0, 8, ("flink", "team-b"))

    s = load_settings({"branch": "from-cli", "max_parallel": None, "poll-interval": "500ms"}, config_file=config)
    assert (s.branch, s.poll_interval, s.max_parallel, s.prune) == ("from-cli", 0.5, 8, True)


def test_config_file_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path / "c.yaml", "repo_url: https://git.example.com/x.git\n")
    monkeypatch.setenv("FLINK_RECONCILER_CONFIG", str(config))
    assert load_settings().repo_url == "https://git.example.com/x.git"


@pytest.mark.parametrize(
    ("text", "seconds"), [("15", 15.0), ("2.5", 2.5), ("15s", 15.0), ("250ms", 0.25), ("2m", 120.0), ("1h", 3600.0)]
)
def test_durations(text: str, seconds: float) -> None:
    assert load_settings({"drift_interval": text}).drift_interval == seconds


def test_secret_from_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = write(tmp_path / "secret", "file-s3cret\n")
    monkeypatch.setenv("FLINK_RECONCILER_GITHUB_WEBHOOK_SECRET_FILE", str(secret))
    monkeypatch.setenv("FLINK_RECONCILER_FORGE_TOKEN_FILE", str(write(tmp_path / "tok", "tok-123")))
    s = load_settings()
    assert s.github_webhook_secret is not None
    assert s.github_webhook_secret.get_secret_value() == "file-s3cret"
    assert s.forge_token is not None
    assert s.forge_token.get_secret_value() == "tok-123"


def test_secret_file_beats_the_config_file_but_not_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = write(tmp_path / "c.yaml", "gitlab_webhook_token: from-yaml\n")
    monkeypatch.setenv("FLINK_RECONCILER_GITLAB_WEBHOOK_TOKEN_FILE", str(write(tmp_path / "t", "from-file")))
    s = load_settings(config_file=config)
    assert s.gitlab_webhook_token is not None
    assert s.gitlab_webhook_token.get_secret_value() == "from-file"
    s = load_settings({"gitlab_webhook_token": "from-cli"}, config_file=config)
    assert s.gitlab_webhook_token is not None
    assert s.gitlab_webhook_token.get_secret_value() == "from-cli"


def test_secret_and_secret_file_together_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLINK_RECONCILER_GIT_TOKEN", "a")
    monkeypatch.setenv("FLINK_RECONCILER_GIT_TOKEN_FILE", str(write(tmp_path / "t", "b")))
    with pytest.raises(ConfigError, match="both FLINK_RECONCILER_GIT_TOKEN and FLINK_RECONCILER_GIT_TOKEN_FILE"):
        load_settings()


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_missing_or_empty_secret_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: str | None) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_text(content)
    monkeypatch.setenv("FLINK_RECONCILER_GITEA_WEBHOOK_SECRET_FILE", str(path))
    with pytest.raises(ConfigError, match="FLINK_RECONCILER_GITEA_WEBHOOK_SECRET_FILE") as err:
        load_settings()
    assert str(path) in str(err.value)


def test_every_secret_is_secretstr_and_file_capable() -> None:
    assert set(secret_fields()) == {
        "git_token",
        "github_webhook_secret",
        "gitlab_webhook_token",
        "gitea_webhook_secret",
        "forge_token",
        "ui_auth",
    }


def test_redaction_everywhere(tmp_path: Path) -> None:
    s = load_settings(
        {
            "repo_url": "https://deploy:ghp_repotoken@github.com/acme/flink-apps.git",
            "git_token": "ghp_gittoken",
            "github_webhook_secret": "whsec-1",
            "gitlab_webhook_token": "whsec-2",
            "gitea_webhook_secret": "whsec-3",
            "status_sink": "github",
            "forge_token": "ghp_forgetoken",
            "forge_repo": "acme/flink-apps",
        }
    )
    for text in (str(s.redacted()), repr(s), str(s)):
        for secret in ("ghp_repotoken", "ghp_gittoken", "whsec-1", "whsec-2", "whsec-3", "ghp_forgetoken"):
            assert secret not in text, (secret, text)
    # A plain dump is for programs (the URL stays usable), but SecretStr values stay masked there too.
    dumped = s.model_dump_json()
    for secret in ("ghp_gittoken", "whsec-1", "whsec-2", "whsec-3", "ghp_forgetoken"):
        assert secret not in dumped
    red = s.redacted()
    assert red["forge_token"] == REDACTED
    assert red["github_webhook_secret"] == REDACTED
    assert red["gitea_webhook_secret"] == REDACTED
    assert red["repo_url"] == f"https://{URL_REDACTED}@github.com/acme/flink-apps.git"
    assert red["forge_repo"] == "acme/flink-apps"
    assert load_settings().redacted()["github_webhook_secret"] is None


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://github.com/acme/x.git", "https://github.com/acme/x.git"),
        ("git@github.com:acme/x.git", "git@github.com:acme/x.git"),
        ("ssh://git@host:2222/x.git", "ssh://git@host:2222/x.git"),
        ("https://tok@host/x.git", f"https://{URL_REDACTED}@host/x.git"),
        ("https://u:p@host:8443/x.git", f"https://{URL_REDACTED}@host:8443/x.git"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_validation_errors_name_field_and_variable_but_not_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings({"max_parallel": 0, "runtime": "docker", "github_webhook_secret": 12345678})
    text = str(err.value)
    assert "max_parallel (FLINK_RECONCILER_MAX_PARALLEL)" in text
    assert "runtime" in text
    assert "github_webhook_secret" in text
    assert "12345678" not in text


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"poll_interval": "soon"}, "not a duration"),
        ({"poll_interval": 0}, "greater than 0"),
        ({"mass_delete_threshold": 1.5}, "mass_delete_threshold"),
        ({"path": "../outside"}, "inside the repository"),
        ({"listen_port": 70000}, "listen_port"),
        ({"log_format": "xml"}, "log_format"),
        ({"rest_via": "tunnel"}, "rest_via"),
        ({"status_sink": "github"}, "needs forge_token, forge_repo"),
        ({"status_sink": "gitea", "forge_token": "t", "forge_repo": "a/b"}, "needs forge_api_url"),
    ],
)
def test_invalid_values(overrides: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_settings(overrides)


def test_config_file_problems(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown_setting"):
        load_settings(config_file=write(tmp_path / "a.yaml", "unknown_setting: 1\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(config_file=write(tmp_path / "b.yaml", "branch: [unclosed\n"))
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(config_file=write(tmp_path / "c.yaml", "- a\n- b\n"))
    with pytest.raises(ConfigError, match="No such file"):
        load_settings(config_file=tmp_path / "missing.yaml")
    assert load_settings(config_file=write(tmp_path / "empty.yaml", "")).branch == "main"


def test_normalisation() -> None:
    s = load_settings({"log_level": "debug", "path": "/apps/prod/", "github_webhook_secret": ""})
    assert (s.log_level, s.path, s.github_webhook_secret) == ("DEBUG", "apps/prod", None)


def test_forge_api_defaults() -> None:
    gh = load_settings({"status_sink": "github", "forge_token": "t", "forge_repo": "a/b"})
    gl = load_settings({"status_sink": "gitlab", "forge_token": "t", "forge_repo": "a/b"})
    own = load_settings(
        {"status_sink": "github", "forge_token": "t", "forge_repo": "a/b", "forge_api_url": "https://ghe/api/v3/"}
    )
    assert (gh.forge_api_base, gl.forge_api_base, own.forge_api_base) == (
        "https://api.github.com",
        "https://gitlab.com",
        "https://ghe/api/v3",
    )


def test_settings_are_immutable() -> None:
    s = load_settings()
    with pytest.raises(ValueError, match="frozen"):
        s.branch = "other"  # type: ignore[misc]


def test_docs_carry_the_current_settings_reference() -> None:
    assert reference_markdown() in DOCS.read_text(encoding="utf-8"), "regenerate the table in docs/daemon.md"
