"""Regenerate the demo fixtures (``fixtures/enrich_leads.jsonl``) from ``leads.csv``.

The fixtures hold exactly what the local provider server answers for each call the
demo play makes, so a fixture run and a live run produce the same file:

    python -m playline.demo.make_fixtures
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from playline.demo import FIXTURES, LEADS_CSV
from playline.demo.enrich_leads import person_of
from playline.provider_server.config import DEFAULT_HIT_RATES
from playline.provider_server.fake_data import (
    enrich_person,
    find_email,
    lookup_company,
    mailfox_finds,
    prospectr_finds,
    verifly_verify,
)


def main() -> None:
    lines: dict[str, dict[str, object]] = {}

    def add(tool: str, tool_input: dict[str, str], result: dict[str, object]) -> None:
        entry: dict[str, object] = {"tool": tool, "input": tool_input, "result": result}
        lines[json.dumps([tool, tool_input], sort_keys=True)] = entry

    with LEADS_CSV.open() as handle:
        for row in csv.DictReader(handle):
            domain = row["company_domain"]
            add("company_lookup", {"domain": domain}, lookup_company(domain))
            person = person_of(row)  # what the play sends, to the letter
            found = find_email(**person)
            add("email_finder", person, found)
            if found.get("email"):
                email = str(found["email"])
                add("person_enrich", {"email": email}, enrich_person(email))
            # The work_email waterfall: each finder's answer, and the verdict on each
            # address found (the waterfall stops at the first valid one).
            for tool, finder in (
                ("mailfox_email", mailfox_finds),
                ("prospectr_email", prospectr_finds),
            ):
                answer = finder(**person, hit_rate=DEFAULT_HIT_RATES[tool.split("_")[0]])
                add(tool, person, answer)
                if answer.get("email"):
                    verdict = verifly_verify(str(answer["email"]))
                    add("verifly_verify", {"email": str(answer["email"])}, verdict)
                    if verdict["status"] == "valid":
                        break
    out = Path(FIXTURES)
    out.write_text("".join(json.dumps(e, sort_keys=True) + "\n" for e in lines.values()))
    print(f"wrote {len(lines)} fixtures to {out}")


if __name__ == "__main__":
    main()
