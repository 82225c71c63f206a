"""Where the demo's files lie in the installed package, for code that must not import the
demo play itself.

The demo catalog is a worker's catalog when ``PLAYLINE_CATALOG`` is unset
(:mod:`playline.services`), and the demo's folder is one a play may always read its
worker-local files from; :mod:`playline.demo` offers the same paths as ``CATALOG``,
``LEADS_CSV`` and ``FIXTURES``. Only paths: nothing is read here.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["DEMO_CATALOG", "DEMO_DIR", "DEMO_FIXTURES", "DEMO_LEADS_CSV"]

#: The demo's package data: ``playline/demo/`` wherever playline is installed.
DEMO_DIR = Path(str(resources.files("playline").joinpath("demo")))
#: The demo catalog (two providers, three tools).
DEMO_CATALOG = DEMO_DIR / "catalog.toml"
#: The demo leads.
DEMO_LEADS_CSV = DEMO_DIR / "leads.csv"
#: Fixtures answering every call ``enrich_leads`` makes over ``DEMO_LEADS_CSV``.
DEMO_FIXTURES = DEMO_DIR / "fixtures" / "enrich_leads.jsonl"
