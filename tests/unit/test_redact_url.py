"""``redact_url`` hides every password a PostgreSQL URL can carry, and nothing else.

libpq reads a password from the netloc and from the query string (``?password=``,
``sslpassword=`` for the client key); the URL is logged at INFO when a worker opens
its store and quoted in store errors.
"""

from __future__ import annotations

import pytest

from playline.db.urls import redact_url


@pytest.mark.parametrize(
    ("url", "redacted"),
    [
        (
            "postgresql://playline@db/playline?password=hunter2",
            "postgresql://playline@db/playline?password=***",
        ),
        (
            "postgresql://playline:hunter2@db:5432/playline",
            "postgresql://playline:***@db:5432/playline",
        ),
        (
            "postgresql://u:p%40ss@db/x?sslmode=require&PASSWORD=a%26b&sslpassword=key-pw#f",
            "postgresql://u:***@db/x?sslmode=require&PASSWORD=***&sslpassword=***#f",
        ),
        # libpq percent-decodes parameter names too.
        (
            "postgresql:///x?host=/run/pg&pass%77ord=hunter2",
            "postgresql:///x?host=/run/pg&pass%77ord=***",
        ),
        ("postgres://u@[::1]:5432/x?password=", "postgres://u@[::1]:5432/x?password=***"),
    ],
)
def test_every_password_in_the_netloc_or_the_query_is_hidden(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://playline@db/playline",
        "postgresql://u@db/x?options=-csearch_path%3Dtenant_a&application_name=playline",
        "postgresql:///x?passfile=/home/u/.pgpass",
        "sqlite:///var/lib/playline",
    ],
)
def test_a_url_without_a_password_comes_back_as_written(url: str) -> None:
    assert redact_url(url) == url
