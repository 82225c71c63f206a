"""Regenerate examples/fixtures/enrich_leads.jsonl from examples/leads.csv.

The fixtures hold exactly what the local provider server answers for each call the
example play makes, so a fixture run and a live run produce the same file:

    python examples/make_fixtures.py
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from playline.provider_server.fake_data import enrich_person, find_email, lookup_company

HERE = Path(__file__).resolve().parent


def main() -> None:
    lines: dict[str, dict[str, object]] = {}

    def add(tool: str, tool_input: dict[str, str], result: dict[str, object]) -> None:
        entry = {"tool": tool, "input": tool_input, "result": result}
        lines[json.dumps([tool, tool_input], sort_keys=True)] = entry

    with (HERE / "leads.csv").open() as handle:
        for row in csv.DictReader(handle):
            domain = row["company_domain"]
            add("company_lookup", {"domain": domain}, lookup_company(domain))
            person = {
                "first_name": row["first_name"],
                "last_name": row["last_name"],
                "domain": domain,
            }
            found = find_email(**person)
            add("email_finder", person, found)
            if found.get("email"):
                email = str(found["email"])
                add("person_enrich", {"email": email}, enrich_person(email))
    out = HERE / "fixtures" / "enrich_leads.jsonl"
    out.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in lines.values()))
    print(f"wrote {len(lines)} fixtures to {out}")


if __name__ == "__main__":
    main()
