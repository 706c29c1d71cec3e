"""Links to a commit on the forge a repository URL names (GitHub, GitLab, Gitea). Pure."""

from __future__ import annotations

import re
from urllib.parse import quote, urlsplit

_SCP = re.compile(r"^(?:[^@/\s]+@)?(?P<host>[^:/\s]+):(?P<path>[^\s]+)$")  # git@github.com:owner/repo.git
_SHA = re.compile(r"[0-9a-f]{7,64}\Z")


def repo_web_url(repo_url: str | None) -> tuple[str, str] | None:
    """(forge, https URL of the repository) when `repo_url` is a GitHub, GitLab or Gitea one; else None.
    Credentials in the URL are dropped; a local path or an unknown host gives None."""
    if not repo_url:
        return None
    m = _SCP.match(repo_url) if "://" not in repo_url else None
    if m:
        host, path = m.group("host"), m.group("path")
    else:
        try:
            parts = urlsplit(repo_url)
        except ValueError:
            return None
        if parts.scheme not in ("http", "https", "ssh", "git") or not parts.hostname:
            return None
        host, path = parts.hostname, parts.path
    forge = _forge_of(host.lower())
    path = path.strip("/").removesuffix(".git")
    if forge is None or path.count("/") < 1 or any(p in ("", "..") for p in path.split("/")):
        return None
    return forge, f"https://{host.lower()}/{quote(path)}"


def _forge_of(host: str) -> str | None:
    if host == "github.com" or host.startswith("github."):
        return "github"
    if host == "gitlab.com" or host.startswith("gitlab."):
        return "gitlab"
    if host == "gitea.com" or host.startswith(("gitea.", "codeberg.")) or host == "codeberg.org":
        return "gitea"
    return None


def commit_url(repo_url: str | None, sha: str | None) -> str | None:
    """The forge's page of commit `sha`, or None (no forge, or not a commit id)."""
    web = repo_web_url(repo_url)
    if web is None or not sha or not _SHA.match(sha):
        return None
    forge, base = web
    return f"{base}/-/commit/{sha}" if forge == "gitlab" else f"{base}/commit/{sha}"
