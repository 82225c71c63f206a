"""Store URLs as they may be shown: without their passwords."""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

__all__ = ["redact_url"]


def redact_url(url: str) -> str:
    """``url`` without its passwords, for messages and logs.

    libpq also takes a password as a query parameter (``?password=...``, or
    ``sslpassword`` for the client key; names may be percent-encoded), so every
    parameter whose name ends in ``password`` is hidden as well as the netloc's.
    Everything else is kept as written (no re-encoding).
    """
    parts = urlsplit(url)
    if parts.password is not None:
        host = parts.netloc.rsplit("@", 1)[-1]
        # The netloc follows "scheme://" and is the first place it occurs.
        url = url.replace(parts.netloc, f"{parts.username or ''}:***@{host}", 1)
    if parts.query:
        fields = []
        for field in parts.query.split("&"):
            name, sep, _ = field.partition("=")
            if sep and unquote(name).strip().lower().endswith("password"):
                field = f"{name}=***"
            fields.append(field)
        start = url.index("?") + 1  # neither the netloc nor the path holds a "?"
        url = url[:start] + "&".join(fields) + url[start + len(parts.query) :]
    return url
