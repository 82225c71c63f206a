"""``playline estimate``: what a play would cost, without calling any provider.

The estimate is a run of the play on the workers (``estimate-PLAY-...`` in the Temporal
UI) that counts each call from the receipts instead of making it (see
:mod:`playline.calls.estimate`). Its input is handled as ``playline run`` handles it
(``--csv`` streamed into the workers' store, ``--input`` JSON, ``--fixtures``), and it
prints one line per column, tool and provider, then totals per provider and overall.

``playline run --confirm-over N`` runs the same estimate first (quietly) and refuses
the run when its worst case is over ``N`` (:func:`refusal`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from rich.markup import escape

from playline.calls.estimate_tally import Estimate, EstimateTotals
from playline.cli.input_columns import check_input_columns
from playline.cli.render import console, out, print_json
from playline.cli.starting import (
    EXIT_REFUSED,
    Launch,
    add_play_flags,
    play_input,
    run_options,
    upload_input_csv,
)
from playline.client import new_estimate_id, start_estimate
from playline.config import Settings
from playline.worker import connect

__all__ = [
    "add_estimate_parser",
    "cmd_estimate",
    "credits_text",
    "estimate",
    "refusal",
    "spend_currency",
    "within",
]

#: What the table says about the worst case, under it.
WORST_CASE_NOTE = (
    "dependent calls with unknown input are counted in the worst case (their input is an "
    "answer not paid for yet); free calls are answered by receipts still fresh"
)


def credits_text(credits: float) -> str:
    """Credits as the CLI prints them: up to two decimals, no exponent, no trailing zeros."""
    text = f"{round(credits, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def add_estimate_parser(
    sub: Any, common: Callable[[argparse.ArgumentParser], None]
) -> argparse.ArgumentParser:
    """``playline estimate PLAY --csv F [--input JSON] [--json]``."""
    parser: argparse.ArgumentParser = sub.add_parser(
        "estimate", help="what a play would cost, counted from receipts; no provider is called"
    )
    common(parser)
    add_play_flags(parser)
    parser.add_argument(
        "--fixtures", nargs="+", help="estimate a fixture-mode run (its receipts are its own)"
    )
    parser.add_argument("--id", help="workflow id (default estimate-PLAY-random)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    parser.set_defaults(enforce_pacing=False)
    return parser


async def estimate(
    launch: Launch, *, workflow_id: str | None = None, quiet: bool = False
) -> Estimate:
    """Run the estimate of ``launch.play`` on the workers and wait for it."""
    play = launch.play
    workflow_id = workflow_id or new_estimate_id(play)
    handle = await start_estimate(
        launch.client,
        play,
        launch.input,
        options=launch.options,
        id=workflow_id,
        task_queue=launch.task_queue,
    )
    await launch.started(handle, workflow_id, None if quiet else "estimating")
    result = await handle.result()
    return Estimate.from_tally(
        result.stats.estimate, play=play, workflow_id=workflow_id, prices=result.stats.prices
    )


def refusal(found: Estimate, over: float) -> str | None:
    """The one line ``run --confirm-over`` exits with, or ``None`` when within it."""
    worst = found.total.worst_credits
    if worst <= over + 1e-9:
        return None
    return (
        f"estimate: worst case {credits_text(worst)} credits (expected "
        f"{credits_text(found.total.expected_credits)}) is over --confirm-over "
        f"{credits_text(over)}; add --yes to run anyway"
    )


def spend_currency(found: Estimate, amount: float) -> tuple[str | None, str | None]:
    """``run --max-spend``: the currency the money cap is in (that of every provider the
    estimate says the run may call), or the one line the run is refused with: a provider
    with no ``credit_price``, or providers priced in different currencies. ``(None,
    None)`` when the run calls no provider."""
    unpriced = [p for p in found.by_provider if p not in found.prices]
    if unpriced:
        return None, (
            f"--max-spend {amount:g}: provider {', '.join(sorted(unpriced))} has no "
            "credit_price in the catalog, so its calls cannot be counted in money; state "
            "its price or cap the run with --max-credits"
        )
    currencies = sorted({str(found.prices[p].get("currency") or "USD") for p in found.by_provider})
    if len(currencies) > 1:
        return None, (
            f"--max-spend {amount:g}: the providers this run may call price their credits in "
            f"different currencies ({', '.join(currencies)}); cap it with --max-credits "
            "(or --max-credits-for PROVIDER=N) instead"
        )
    return (currencies[0] if currencies else None), None


HEADINGS = (
    "column",
    "tool",
    "provider",
    "calls",
    "free (receipts)",
    "to pay",
    "unknown input",
    "worst case",
    "expected",
    "basis",
)
#: Columns of numbers, aligned right.
_NUMBERS = frozenset(range(3, 9))


def within(found: Estimate, over: float) -> str:
    """What ``run --confirm-over`` says before a run its estimate allows."""
    return (
        f"estimate: worst case {credits_text(found.total.worst_credits)} credits (expected "
        f"{credits_text(found.total.expected_credits)}) is within --confirm-over "
        f"{credits_text(over)}"
    )


def print_estimate(found: Estimate) -> None:
    """The estimate as a table on stdout, totals per provider and overall under it."""
    rows = [
        [line.column, line.tool, line.provider, *_figures(line), line.basis] for line in found.lines
    ]
    totals = [
        ["total", "", provider, *_figures(figures), ""]
        for provider, figures in found.by_provider.items()
    ]
    totals.append(["total", "", "all providers", *_figures(found.total), ""])
    console_out = out()
    console_out.print(f"estimate of {found.play}: {found.rows} rows", markup=False)
    for text in _aligned([list(HEADINGS), *rows, *totals], rule_before=1 + len(rows)):
        console_out.print(text, markup=False, highlight=False)
    if found.rows_failed:
        console_out.print(f"{found.rows_failed} rows would fail (their resolvers raise)")
    worst, expected = found.money("worst"), found.money("expected")
    if worst is not None and expected is not None:
        console_out.print(
            f"in money: worst case {worst}, expected {expected} (the catalog's credit prices)",
            markup=False,
            highlight=False,
        )
    console_out.print(WORST_CASE_NOTE, markup=False, highlight=False)


def _aligned(rows: list[list[str]], *, rule_before: int) -> list[str]:
    """Plain text columns (a pipe or a file gets every character), with rules under the
    headings and above the totals."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADINGS))]

    def text(row: list[str]) -> str:
        cells = [
            cell.rjust(width) if i in _NUMBERS else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * width for width in widths)
    lines = [text(row) for row in rows]
    return [lines[0], rule, *lines[1:rule_before], rule, *lines[rule_before:]]


def _figures(totals: EstimateTotals) -> list[str]:
    return [
        str(totals.calls),
        str(totals.cached),
        str(totals.to_pay),
        str(totals.unknown_input),
        credits_text(totals.worst_credits),
        credits_text(totals.expected_credits),
    ]


async def cmd_estimate(args: argparse.Namespace, settings: Settings) -> int:
    options = run_options(args)
    input = play_input(args)
    client = await connect(settings=settings)
    if args.csv:
        # A file the run would refuse is refused here too, before it is uploaded.
        refused = await check_input_columns(client, args.play, args.task_queue, args.csv)
        if refused is not None:
            console.print(f"[red]error:[/] {escape(refused)}", highlight=False)
            return EXIT_REFUSED
        input["csv_path"] = await upload_input_csv(args.csv, settings)
    launch = Launch(client, settings, args.play, input, options, args.task_queue)
    found = await estimate(launch, workflow_id=args.id, quiet=args.json)
    if args.json:
        print_json(found)
    else:
        print_estimate(found)
    return 0
