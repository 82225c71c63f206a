"""Keeping API keys out of text: error messages, results, and the HTTP libraries' logs.

A provider's response can echo a key (a 401 body quoting the key it got), so every
piece of response text that reaches an error message or a result passes through a
:class:`SecretScrubber` holding every key value of the catalog first.

A provider that takes its key in the query string (``auth.query``) puts it in the
request's URL, and httpx logs every request's URL at INFO (``HTTP Request: GET
https://...?api_key=...``). :func:`scrub_http_logs` installs a filter on the HTTP
libraries' loggers that rewrites each record before any handler sees it: the value
of every key parameter is replaced (by name, whatever the value), and every known
key value too (wherever it appears). A filter on the loggers, not on a handler,
so it holds whatever handlers the application configures; it costs nothing while
those loggers are disabled (a record is only made for an enabled level).
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
import weakref
from collections.abc import Iterable, Mapping

__all__ = [
    "HTTP_LOGGERS",
    "REDACTED",
    "SecretScrubber",
    "redact_query_parameters",
    "scrub_http_logs",
]

REDACTED = "[redacted]"

#: The loggers of the HTTP stack a provider call goes through that may carry a URL.
#: (Filters of a logger apply to its own records only, so children are listed.)
HTTP_LOGGERS = (
    "httpx",
    "httpcore",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "aiohttp.client",
    "aiohttp.internal",
)


class SecretScrubber:
    """Replaces every known secret value (and its URL-encoded form) in a text.

    Values shorter than 4 characters are not scrubbed: they would blank out
    ordinary words, and no real API key is that short.
    """

    def __init__(self, secrets: Iterable[str]) -> None:
        forms: set[str] = set()
        for secret in secrets:
            if len(secret) >= 4:
                forms.add(secret)
                forms.add(urllib.parse.quote(secret, safe=""))
                forms.add(urllib.parse.quote_plus(secret))
        # Longest first, so a key that contains another is replaced whole.
        self._forms = sorted(forms, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            if form in text:
                text = text.replace(form, REDACTED)
        return text

    def headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        """A copy of ``headers`` fit to log: secrets scrubbed from every value."""
        return {name: self(value) for name, value in headers.items()}


def _parameter_pattern(names: Iterable[str]) -> re.Pattern[str] | None:
    forms = {form for name in names for form in (name, urllib.parse.quote(name, safe=""))}
    if not forms:
        return None
    alternatives = "|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True))
    # A parameter starts the query (after ?) or follows &; its value runs to the next
    # &, #, quote or blank (a URL quoted in a log line ends there).
    return re.compile(rf"([?&](?:{alternatives})=)[^&#\s\"'<>]*")


def redact_query_parameters(text: str, names: Iterable[str]) -> str:
    """``text`` with the value of every query parameter named in ``names`` replaced."""
    pattern = _parameter_pattern(names)
    return text if pattern is None else pattern.sub(rf"\g<1>{REDACTED}", text)


class _HttpLogScrubber(logging.Filter):
    """Rewrites a record of the HTTP libraries with the key parameters and values gone."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        # The scrubbers of the live provider clients (weakly: a client gone drops its keys).
        self._scrubbers: weakref.WeakSet[SecretScrubber] = weakref.WeakSet()

    def add(self, names: Iterable[str], scrub: SecretScrubber | None) -> None:
        with self._lock:
            new = set(names) - self._names
            if new:
                self._names |= new
                self._pattern = _parameter_pattern(self._names)
            if scrub is not None:
                self._scrubbers.add(scrub)

    def filter(self, record: logging.LogRecord) -> bool:
        pattern, scrubbers = self._pattern, list(self._scrubbers)
        if pattern is None and not scrubbers:
            return True
        try:
            text = record.getMessage()
        except Exception:  # a malformed record: leave it to logging's own handling
            return True
        scrubbed = pattern.sub(rf"\g<1>{REDACTED}", text) if pattern is not None else text
        for scrub in scrubbers:
            scrubbed = scrub(scrubbed)
        if scrubbed != text:
            record.msg, record.args = scrubbed, None
        return True


_FILTER = _HttpLogScrubber()
_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def scrub_http_logs(parameter_names: Iterable[str], scrub: SecretScrubber | None = None) -> None:
    """Keep these key parameters (and ``scrub``'s secrets) out of the HTTP libraries' logs.

    Idempotent and additive: each provider client registers its catalog's key
    parameters and its scrubber; the filter is installed once per process.
    """
    global _INSTALLED
    _FILTER.add(parameter_names, scrub)
    with _INSTALL_LOCK:
        if not _INSTALLED:
            for name in HTTP_LOGGERS:
                logging.getLogger(name).addFilter(_FILTER)
            _INSTALLED = True
