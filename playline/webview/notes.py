"""Short-lived server-side notes behind opaque ids: what must not ride in a URL.

A text filter holds a cell value the user typed, and a URL (the address bar, the
history, a proxy's or the server's access log) must carry no row data; the line an
action answered is kept the same way for the page it redirects to. A bounded map:
the oldest notes go first, so memory does not grow with use.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

__all__ = ["Notes"]


class Notes:
    def __init__(self, capacity: int = 512) -> None:
        self.capacity = capacity
        self._notes: OrderedDict[str, str] = OrderedDict()

    def keep(self, text: str) -> str:
        """The id of a new note holding ``text``."""
        note_id = secrets.token_urlsafe(9)
        self._notes[note_id] = text
        while len(self._notes) > self.capacity:
            self._notes.popitem(last=False)
        return note_id

    def get(self, note_id: str | None) -> str | None:
        return self._notes.get(note_id) if note_id else None
