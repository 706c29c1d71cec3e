"""The one rule for credentials in URLs (`redaction.redact_urls`), alone and inside free text, on the URLs a
hostile or careless configuration holds: raw `@` in a password, percent-encoding, no scheme, scp-like, ssh,
tokens in query strings, IPv6 hosts, broken authorities."""

from __future__ import annotations

import time

import pytest

from reconciler.logs import redact
from reconciler.redaction import REDACTED, redact_url, redact_urls
from reconciler.settings import redact_url as settings_redact_url

R = REDACTED

CASES = [
    # (url, shown, secret that must not appear)
    ("http://user:pa@ss@word99@host/x.git", f"http://{R}@host/x.git", "word99"),
    ("https://user:pa@ss@host:8443/x.git", f"https://{R}@host:8443/x.git", "pa@ss"),
    ("https://user:pa%40ss@host/x.git", f"https://{R}@host/x.git", "pa%40ss"),
    ("https://ghp_tok3n@github.com/acme/x.git", f"https://{R}@github.com/acme/x.git", "ghp_tok3n"),
    ("https://oauth2:glpat-xyz@gitlab.example/a/b.git", f"https://{R}@gitlab.example/a/b.git", "glpat-xyz"),
    ("http://user:p@ss@[::1]:8080/x.git", f"http://{R}@[::1]:8080/x.git", "p@ss"),
    ("http://user:pw@[2001:db8::7]/x.git", f"http://{R}@[2001:db8::7]/x.git", "pw@"),
    ("http://[::1]:8080/x.git", "http://[::1]:8080/x.git", None),
    ("ssh://git@host:2222/x.git", "ssh://git@host:2222/x.git", None),
    ("ssh://git:hunter2@host/x.git", f"ssh://{R}@host/x.git", "hunter2"),
    ("git+ssh://deploy@host/x.git", "git+ssh://deploy@host/x.git", None),
    ("git@github.com:acme/x.git", "git@github.com:acme/x.git", None),
    ("user:pa@ss@host:acme/x.git", f"{R}@host:acme/x.git", "pa@ss"),
    ("user:secretpw@host/x.git", f"{R}@host/x.git", "secretpw"),
    ("https://host/x.git?access_token=abc123&ref=main", f"https://host/x.git?access_token={R}&ref=main", "abc123"),
    ("https://s3.example/b/k?X-Amz-Credential=AKIA1&X-Amz-Signature=f00d&x=1",
     f"https://s3.example/b/k?X-Amz-Credential={R}&X-Amz-Signature={R}&x=1", "f00d"),
    ("https://blob.example/c/j.jar?sv=2020&sig=s1gn4ture", f"https://blob.example/c/j.jar?sv=2020&sig={R}",
     "s1gn4ture"),
    ("http://user:pa/ss@host/x.git", f"http://{R}@host/x.git", "pa/ss"),  # raw '/' in the password: broken, masked
    ("https://git.example.com/a@b", "https://git.example.com/a@b", None),  # '@' in the path: no user-info
    ("https://registry.example/@scope/pkg", "https://registry.example/@scope/pkg", None),
    ("/srv/git/apps.git", "/srv/git/apps.git", None),
    ("file:///srv/git/apps.git", "file:///srv/git/apps.git", None),
    ("http://127.0.0.1:8081/jobs/overview", "http://127.0.0.1:8081/jobs/overview", None),
    ("HTTPS://TOKEN@HOST/X", f"HTTPS://{R}@HOST/X", "TOKEN"),
]


@pytest.mark.parametrize(("url", "shown", "secret"), CASES)
def test_one_url(url: str, shown: str, secret: str | None) -> None:
    assert redact_url(url) == shown
    assert settings_redact_url(url) == shown  # the settings' name is the same function
    if secret is not None:
        assert secret not in redact_url(url)


@pytest.mark.parametrize(("url", "shown", "secret"), CASES)
def test_the_same_url_inside_free_text(url: str, shown: str, secret: str | None) -> None:
    for text, expected in (
        (f"git fetch {url} failed: exit 128", f"git fetch {shown} failed: exit 128"),
        (f"fatal: unable to access '{url}': 403", f"fatal: unable to access '{shown}': 403"),
        (f'{{"repo": "{url}", "n": 1}}', f'{{"repo": "{shown}", "n": 1}}'),
        (f"<{url}>", f"<{shown}>"),
        (f"repository: {url}\nnext line", f"repository: {shown}\nnext line"),
    ):
        assert redact_urls(text) == expected
        assert redact(text) == expected  # the logs' and pages' redaction is this rule


def test_several_urls_in_one_line() -> None:
    text = "from https://a:b@one/x to http://c:d@e@two/y and https://three/z?token=t0k"
    assert redact_urls(text) == f"from https://{R}@one/x to http://{R}@two/y and https://three/z?token={R}"


def test_ordinary_text_is_left_alone() -> None:
    for text in ("ssh to git@github.com:acme/apps.git", "mail dev@example.com", "at 12:30 we met",
                 "s3://bucket/savepoints/sp-1", "a=b&c=d", "key: value", "x@y:z", "http://", "://@"):
        assert redact_urls(text) == text


@pytest.mark.parametrize("hostile", [
    "a.a." * 50_000, "http://" * 30_000, "x:y@" * 50_000, "@" * 200_000, "http://a" + "@" * 200_000,
    "a:" + "b@" * 100_000 + "c", "?k=" * 60_000, ("http://u:p@h/ " * 20_000),
])
def test_linear_on_hostile_text(hostile: str) -> None:
    """A 100-200 KB message (a Flink stack trace, a spoofed subject) is redacted on every log line and page:
    it must take milliseconds, not minutes."""
    t0 = time.process_time()
    redact_urls(hostile)
    assert time.process_time() - t0 < 2.0


@pytest.mark.parametrize("url", ["http://user:pa@ss@word99@github.com/acme/x.git",
                                 "user:pa@ss@word99@github.com:acme/x.git",
                                 "https://tok3n@github.com/acme/x.git?access_token=word99"])
def test_a_commit_link_never_carries_the_credentials(url: str) -> None:
    from reconciler.ui.forge import commit_url

    link = commit_url(url, "a" * 40) or ""
    assert "word99" not in link and "pa@ss" not in link and "tok3n" not in link
