"""What can be wrong with where the stores live, as one-line errors that say what to do."""

from __future__ import annotations

from playline.errors import PlaylineError

__all__ = [
    "InvalidStoreUrl",
    "StoreNotFound",
    "StoreSchemaTooNew",
    "StoreUnavailable",
    "psycopg_missing",
    "unreachable",
]


class InvalidStoreUrl(PlaylineError):
    """``PLAYLINE_STORE_URL`` names no backend playline knows."""


class StoreNotFound(PlaylineError):
    """A client asked for the workers' store where there is none (nothing was created)."""


class StoreSchemaTooNew(PlaylineError):
    """The store was migrated by a newer playline than this one; upgrade before using it."""


class StoreUnavailable(PlaylineError):
    """The PostgreSQL store cannot be reached (or psycopg is not installed)."""

    retryable = True


def psycopg_missing() -> StoreUnavailable:
    return StoreUnavailable(
        "a PostgreSQL store needs psycopg; install playline with the 'postgres' "
        "extra (pip install 'playline[postgres]')"
    )


def unreachable(where: str, err: Exception) -> StoreUnavailable:
    """The server's reason on one line, and what to check."""
    reason = " ".join(str(err).split()) or type(err).__name__
    return StoreUnavailable(
        f"cannot reach the PostgreSQL store at {where}: {reason}; check "
        "PLAYLINE_STORE_URL and that the server is up"
    )
