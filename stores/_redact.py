"""A store URL or DSN as it may be shown: its passwords and secret parameters replaced by ``***``.

One rule finds the secrets of a URL (`redact_url` shows it without them, `url_secrets` lists
them to scrub from a text that may quote them, such as a driver's error):

- the password of the userinfo: ``scheme://user:PASSWORD@host/...``;
- the value of a query or fragment parameter whose name looks secret (it holds ``pass``,
  ``pwd``, ``secret``, ``token``, ``key``, ``auth``, ``credential`` or ``signature``, in any
  case): ``?password=...``, ``&sslpassword=...``, ``&api_key=...``;
- in libpq's ``key=value`` form (``host=db password=... dbname=runs``), the value of each such
  key, quoted (``password='a b'``) or not.

Anything else is kept as written, so the URL still says which store it is.
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ("redact_url", "url_secrets")

SHOWN = "***"
_SECRET_NAME = re.compile(r"pass|pwd|secret|token|key|auth|credential|signature", re.IGNORECASE)
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")
_PARAMETER = re.compile(r"([^&;=#]*)=([^&;#]*)")  # name=value in a URL's query or fragment
_KEY_VALUE = re.compile(r"([A-Za-z_][\w.-]*)\s*=\s*('(?:[^'\\]|\\.)*'?|\S*)")  # libpq's form


def _spans(url: str) -> list[tuple[int, int]]:
    """Where the secrets of `url` are: (start, end) of each, in order."""
    scheme = _SCHEME.match(url)
    if scheme is None:
        return [
            match.span(2)
            for match in _KEY_VALUE.finditer(url)
            if _SECRET_NAME.search(match.group(1)) and match.group(2)
        ]
    spans: list[tuple[int, int]] = []
    start = scheme.end()
    if url.startswith("//", start):
        start += 2
        end = len(url)
        for mark in "/?#":
            found = url.find(mark, start)
            if found != -1:
                end = min(end, found)
        userinfo_end = url.rfind("@", start, end)
        if userinfo_end != -1:
            colon = url.find(":", start, userinfo_end)
            if colon != -1 and colon + 1 < userinfo_end:
                spans.append((colon + 1, userinfo_end))
        start = end
    query = url.find("?", start)
    fragment = url.find("#", start)
    begin = min(place for place in (query, fragment, len(url)) if place != -1)
    for match in _PARAMETER.finditer(url, begin):
        if _SECRET_NAME.search(urllib.parse.unquote_plus(match.group(1))) and match.group(2):
            spans.append(match.span(2))
    return spans


def redact_url(url: str) -> str:
    """`url` (a store URL, or a libpq ``key=value`` DSN) with each secret replaced by ``***``.

    Use it wherever a URL reaches a person: an error, a log event, a repr, a page.

    Example:
        ```python
        redact_url("postgresql://app:hunter2@db/runs?sslpassword=x&sslmode=require")
        # 'postgresql://app:***@db/runs?sslpassword=***&sslmode=require'
        ```
    """
    shown: list[str] = []
    last = 0
    for start, end in _spans(url):
        shown += [url[last:start], SHOWN]
        last = end
    return "".join([*shown, url[last:]])


def url_secrets(url: str) -> tuple[str, ...]:
    """The secrets of `url`, as written and decoded, longest first: to scrub from other texts.

    A driver's error may quote a password decoded (``p@ss`` for ``p%40ss``) or unquoted
    (``a b`` for libpq's ``'a b'``): each form is listed.
    """
    found: set[str] = set()
    for start, end in _spans(url):
        raw = url[start:end]
        forms = {raw, urllib.parse.unquote(raw), urllib.parse.unquote_plus(raw)}
        if raw.startswith("'"):
            forms.add(re.sub(r"\\(.)", r"\1", raw[1:].removesuffix("'")))
        found.update(form for form in forms if form)
    return tuple(sorted(found, key=lambda form: (-len(form), form)))
