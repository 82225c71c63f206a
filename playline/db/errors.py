"""What can be wrong with where the stores live, as one-line errors that say what to do."""

from __future__ import annotations

from playline.errors import PlaylineError

__all__ = ["InvalidStoreUrl", "StoreNotFound", "StoreSchemaTooNew", "StoreUnavailable"]


class InvalidStoreUrl(PlaylineError):
    """``PLAYLINE_STORE_URL`` names no backend playline knows."""


class StoreNotFound(PlaylineError):
    """A client asked for the workers' store where there is none (nothing was created)."""


class StoreSchemaTooNew(PlaylineError):
    """The store was migrated by a newer playline than this one; upgrade before using it."""


class StoreUnavailable(PlaylineError):
    """The PostgreSQL store cannot be reached (or psycopg is not installed)."""

    retryable = True
