"""The address of a run's page in the sheet view (``playline ui``), for links to it.

Apart from the view itself (:mod:`playline.webview`) so the client library, the CLI's
output and a play's Temporal UI details link to a run's sheet without loading the
web server: ids only in the address, never a row.
"""

from __future__ import annotations

from urllib.parse import urlencode

__all__ = ["sheet_link"]


def sheet_link(base_url: str, workflow_id: str) -> str:
    """The sheet page of a run on the view at ``base_url``."""
    return f"{base_url.rstrip('/')}/sheet?{urlencode({'id': workflow_id})}"
