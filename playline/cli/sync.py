"""``playline sync RUN_ID --sink NAME``: write a run's rows back to a CRM or a table.

The sink comes from the catalog (``[sinks.NAME]``, or a preset's); ``--map`` and
``--id`` add to or replace its mapping. The sync reads the run's last dataset from
the stores the workers write, plans it against the sync ledger (changes only, the
overwrite policies, never a blank) and sends the batches, each a receipted call
(see :mod:`playline.sinks.engine`). ``--dry-run`` sends nothing (not even a read)
and prints, per record and field, what would be written and the policy's verdict.

Exit status: 0 when every record with something to write was written or rejected
(rejections are listed), 4 when the destination parked the sync (its daily limit,
429s past the patience): run the same command again later to write the rest.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from playline.calls.catalog import Catalog
from playline.calls.transport import make_http_client
from playline.cli.render import out
from playline.cli.run_refs import find_run, last_run_ref
from playline.config import Settings
from playline.contract import SyncInput
from playline.errors import PlaylineError
from playline.package_data import DEMO_CATALOG
from playline.services import open_governor
from playline.sinks.engine import SyncReport
from playline.sinks.open import find_sink, sync_mapping, sync_sink
from playline.stores.backends import open_stores
from playline.worker import connect

__all__ = ["add_sync_parser", "cmd_sync"]

#: Exit status when the destination parked the sync before every record was written.
EXIT_PARKED = 4


def add_sync_parser(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    p = sub.add_parser("sync", help="write a run's rows back to a sink (a CRM, a table)")
    common(p)
    p.add_argument("id", metavar="RUN_ID", help="the play run (workflow id)")
    p.add_argument("--sink", required=True, help="the catalog's sink (e.g. hubspot_contacts)")
    p.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="COLUMN=FIELD",
        help="write the run's COLUMN to the destination's FIELD (repeatable; adds to the "
        "sink's map)",
    )
    p.add_argument(
        "--id", dest="id_column", metavar="COLUMN", help="the column identifying the record"
    )
    p.add_argument(
        "--policy",
        action="append",
        default=[],
        metavar="FIELD=POLICY",
        help="always | if_blank | if_verified for FIELD (repeatable; overrides the sink's)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="send nothing; print what would be written"
    )
    p.add_argument("--json", action="store_true", help="print the report as one JSON document")
    p.add_argument(
        "--patience",
        type=float,
        default=300.0,
        metavar="S",
        help="how long to wait out a destination's 429s before parking the sync (default 300)",
    )
    p.add_argument(
        "--lease-ttl",
        type=float,
        default=60.0,
        metavar="S",
        help="how long a batch being written stays this sync's (renewed while it goes); a "
        "killed sync's batch is taken over after it (default 60)",
    )


async def cmd_sync(args: argparse.Namespace, settings: Settings) -> int:
    catalog = Catalog.from_toml(settings.catalog_path or DEMO_CATALOG)
    spec = find_sink(catalog.sinks, args.sink)
    extra = _pairs(args.map, "--map takes COLUMN=FIELD", need_value=True)
    policies = _pairs(args.policy, "--policy takes FIELD=always|if_blank|if_verified")
    mapping = sync_mapping(
        args.sink, spec, extra_map=extra, id_column=args.id_column, policies=policies
    )
    if args.lease_ttl <= 0:
        raise PlaylineError(f"--lease-ttl takes seconds above 0, not {args.lease_ttl:g}")
    request = SyncInput(
        run_ref=await _run_ref(args.id, settings),
        sink=args.sink,
        map=extra,
        id_column=args.id_column,
        policies=policies,
        patience_s=args.patience,
        lease_ttl_s=args.lease_ttl,
    )
    async with await open_stores(settings, create=False) as stores:
        governor, fleet = await open_governor(settings, catalog)
        try:
            async with make_http_client(transport=settings.http_transport) as http:
                report = await sync_sink(
                    request,
                    spec,
                    mapping,
                    settings=settings,
                    providers=catalog.providers,
                    http=http,
                    pacer=governor,
                    stores=stores,
                    dry_run=args.dry_run,
                )
        finally:
            await governor.aclose()
            if fleet is not None:
                await fleet.aclose()
    if args.json:
        print(json.dumps(report.as_json(), default=str), flush=True)
    else:
        _print(report)
    return EXIT_PARKED if report.parked else 0


def _pairs(items: list[str], usage: str, *, need_value: bool = False) -> dict[str, str]:
    """``NAME=VALUE`` arguments as a dict (names and values stripped)."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or (need_value and not value.strip()):
            raise PlaylineError(f"{usage}, not {item!r}")
        pairs[name.strip()] = value.strip()
    return pairs


async def _run_ref(run_id: str, settings: Settings) -> str:
    """The run's last dataset run: the result's, or (not completed) the memo's."""
    client = await connect(settings=settings)
    handle, desc = await find_run(client, run_id, settings.temporal_namespace)
    run_ref = await last_run_ref(handle, desc)
    if run_ref is None:
        raise PlaylineError(f"run {run_id} has no dataset run to sync")
    return run_ref


def _print(report: SyncReport) -> None:
    console = out()
    if report.dry_run:
        for plan in report.plans:
            console.print(f"{plan['record']}", markup=False)
            for f in plan["fields"]:
                before = "" if f["previous"] is None else f" (was {f['previous']})"
                console.print(
                    f"  {f['field']} = {f['value']}{before}: {f['verdict']} [{f['policy']}]",
                    markup=False,
                )
        console.print(
            f"dry run of sink {report.sink}: {report.left} records to send, "
            f"{report.unchanged} unchanged, {report.skipped_by_policy} skipped by policy, "
            f"{report.not_written} rows not written; nothing was sent",
            markup=False,
        )
        return
    console.print(
        f"sink {report.sink}: {report.created} created, {report.updated} updated, "
        f"{report.unchanged} unchanged, {report.skipped_by_policy} skipped by policy, "
        f"{report.rejected} rejected; {report.fields_written} fields written in "
        f"{report.requests} requests",
        markup=False,
    )
    if report.not_written:
        reasons = ", ".join(f"{n} {why}" for why, n in sorted(report.not_written_reasons.items()))
        console.print(f"rows not written: {reasons}", markup=False)
    for rejection in report.rejections:
        console.print(f"rejected {rejection['record']}: {rejection['reason']}", markup=False)
    if report.parked:
        console.print(
            f"parked: {report.parked}; {report.left} records left (run the same sync again)",
            markup=False,
        )
