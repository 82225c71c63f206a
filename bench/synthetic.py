"""Synthetic leads and their fixtures, for benchmarks that need more rows than the demo.

``write_leads(path, n)`` writes ``n`` distinct leads (``lead_id``, ``first_name``,
``last_name``, ``company_domain``, ``source``) over ``n // 20 + 1`` company domains;
``write_fixtures(leads, path)`` writes, streaming, exactly the answers the local
provider server would give for every call ``enrich_leads`` makes on them (the same
functions ``playline.demo.make_fixtures`` uses), so a fixture-mode run finds every
call and dispatches nothing.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from playline.provider_server.fake_data import enrich_person, find_email, lookup_company

FIRST = ["Ada", "Grace", "Alan", "Edsger", "Barbara", "Donald", "Frances", "Ken", "Radia", "Leslie"]
LAST = ["Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson"]


def write_leads(path: Path, n: int) -> Path:
    domains = n // 20 + 1
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["lead_id", "first_name", "last_name", "company_domain", "source"])
        for i in range(n):
            writer.writerow(
                [
                    f"S{i:07d}",
                    f"{FIRST[i % len(FIRST)]}{i}",
                    LAST[(i // len(FIRST)) % len(LAST)],
                    f"co{i % domains}.example",
                    "bench",
                ]
            )
    return path


def write_fixtures(leads: Path, path: Path) -> Path:
    seen_domains: set[str] = set()
    with leads.open(newline="", encoding="utf-8") as src, path.open("w", encoding="utf-8") as out:

        def add(tool: str, tool_input: dict[str, str], result: object) -> None:
            entry = {"tool": tool, "input": tool_input, "result": result}
            out.write(json.dumps(entry, sort_keys=True) + "\n")

        for row in csv.DictReader(src):
            domain = row["company_domain"]
            if domain not in seen_domains:
                seen_domains.add(domain)
                add("company_lookup", {"domain": domain}, lookup_company(domain))
            person = {
                "first_name": row["first_name"],
                "last_name": row["last_name"],
                "domain": domain,
            }
            found = find_email(**person)
            add("email_finder", person, found)
            if found.get("email"):
                add("person_enrich", {"email": str(found["email"])}, enrich_person(found["email"]))
    return path
