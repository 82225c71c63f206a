"""The demo play (``enrich_leads``) and its data, shipped inside the package.

``playline demo`` runs it against the local provider server; the files below are
package data, so an installed playline has them wherever it runs:

* ``catalog.toml`` - the demo catalog (two providers, three tools);
* ``leads.csv`` - 240 leads (236 unique ``lead_id``s);
* ``fixtures/enrich_leads.jsonl`` - what the provider server answers for each of
  the play's calls, for fixture mode (regenerate with
  ``python -m playline.demo.make_fixtures``).
"""

from playline.package_data import DEMO_CATALOG, DEMO_FIXTURES, DEMO_LEADS_CSV

#: The demo catalog; also the default when ``PLAYLINE_CATALOG`` is unset.
CATALOG = DEMO_CATALOG
#: The demo leads.
LEADS_CSV = DEMO_LEADS_CSV
#: Fixtures answering every call ``enrich_leads`` makes over ``LEADS_CSV``.
FIXTURES = DEMO_FIXTURES

__all__ = ["CATALOG", "FIXTURES", "LEADS_CSV"]
