"""The sheet view: a read-only web page of every run, cell by cell (``playline ui``).

Its public face is :func:`webview_app` (a Starlette app over a :class:`RunDesk` and
the sheet store), the desk's types, and :func:`check_exposure`. It reads the sheet
store through the store's read paths and talks to Temporal only through the desk it
is given; it imports nothing of the command line.
"""

from playline.sheet_links import sheet_link
from playline.webview.app import webview_app
from playline.webview.desk import ACTIONS, ExportChoice, RunDesk, RunEstimate, RunSummary
from playline.webview.guard import check_exposure

__all__ = [
    "ACTIONS",
    "ExportChoice",
    "RunDesk",
    "RunEstimate",
    "RunSummary",
    "check_exposure",
    "sheet_link",
    "webview_app",
]
