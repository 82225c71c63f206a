"""The sheet view's pages: runs, one run's sheet, a cell's provenance, the controls.

Server-rendered HTML (Jinja2, autoescaped: a cell's value is text, never markup) with
no script of its own: links and forms do everything, a page of a running run reloads
itself every few seconds (``<meta http-equiv="refresh">``), and every page is one
request that reads one page of rows. Nothing the view serves is fetched from
elsewhere: the templates and the stylesheet ship in the wheel.

URLs carry ids, column names, outcomes and page numbers, never a row's value: a
typed filter is posted and kept on the server behind an opaque id (:mod:`.notes`).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from jinja2 import Environment, PackageLoader, Undefined, select_autoescape
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from playline.errors import PlaylineError
from playline.request_body import BodyTooLarge, read_capped_body
from playline.stores.provenance_cells import credits_text, iso_utc
from playline.stores.sheet import SheetStore
from playline.webview.cells import cell_panel
from playline.webview.charts import read_charts
from playline.webview.desk import ACTIONS, ExportChoice, RunDesk, RunSummary
from playline.webview.estimate_chart import beside
from playline.webview.guard import Guard
from playline.webview.notes import Notes
from playline.webview.outcomes import OUTCOMES, row_outcomes, row_status
from playline.webview.sheet_pages import SheetQuery, read_page

__all__ = ["PAGE_ROWS", "REFRESH_S", "webview_app"]


#: Rows on one sheet page.
PAGE_ROWS = 50
#: Seconds between reloads of a page whose run is still going.
REFRESH_S = 3
#: Runs the runs page lists.
LISTED_RUNS = 50

_ENV = Environment(
    loader=PackageLoader("playline.webview", "templates"),
    autoescape=select_autoescape(default=True),
)


def _credits(value: Any) -> str:
    """A credits figure as the export writes it; ``-`` when there is none."""
    if value is None or isinstance(value, Undefined):
        return "-"
    return credits_text(value) or "0"


def _rps(value: Any) -> str:
    """A rate, calls per second: two decimals at most; ``-`` when there is none."""
    if value is None or isinstance(value, Undefined):
        return "-"
    return f"{float(value):.2f}".rstrip("0").rstrip(".")


_ENV.filters["credits"] = _credits
_ENV.filters["rps"] = _rps


def _render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    return HTMLResponse(_ENV.get_template(name).render(**context), status)


def _int(value: str | None, default: int, lowest: int = 0) -> int:
    try:
        return max(lowest, int(value)) if value not in (None, "") else default
    except ValueError:
        return default


def webview_app(
    desk: RunDesk,
    open_sheet: Callable[[], contextlib.AbstractAsyncContextManager[SheetStore]],
    *,
    token: str | None = None,
    hosts: list[str] | None = None,
    refresh_s: int = REFRESH_S,
) -> Starlette:
    """The view over ``desk`` (Temporal) and the sheet store ``open_sheet`` opens.

    Args:
        desk: the runs and their controls (``playline ui`` passes the CLI's).
        open_sheet: opens the workers' sheet store read-only for the app's life.
        token: asked of every request from another address than loopback.
        hosts: ``Host`` names answered (DNS rebinding); empty: any.
        refresh_s: a running run's pages reload this often.
    """
    notes = Notes()
    held: dict[str, SheetStore] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_sheet() as sheet:
            held["sheet"] = sheet
            yield

    async def runs_page(request: Request) -> Response:
        try:
            runs = await desk.list_runs(LISTED_RUNS)
        except PlaylineError as err:
            return _render("error.html", 502, message=str(err))
        going = any(r.running for r in runs)
        return _render("runs.html", runs=runs, refresh=refresh_s if going else None)

    async def picked_run(params: Any) -> tuple[RunSummary, int] | Response:
        """The run a page names (``id``) and which of its dataset runs (``ref``, default
        the last), or the error page when there is no such run."""
        try:
            run = await desk.run(params.get("id", ""))
        except PlaylineError as err:
            return _render("error.html", 404, message=str(err))
        last = len(run.run_refs) - 1
        return run, min(_int(params.get("ref"), last), max(0, last))

    async def sheet_page(request: Request) -> Response:
        params = request.query_params
        picked = await picked_run(params)
        if isinstance(picked, Response):
            return picked
        run, ref_index = picked
        workflow_id, refs = run.workflow_id, run.run_refs
        columns_known: list[str] = []
        query = SheetQuery(
            page=_int(params.get("page"), 0),
            size=PAGE_ROWS,
            outcome=params.get("outcome") if params.get("outcome") in OUTCOMES else None,
            outcome_column=params.get("ocol") or None,
            text_column=params.get("tcol") or None,
            text=notes.get(params.get("f")),
            sort=params.get("sort") or None,
            descending=params.get("desc") == "1",
        )
        page = None
        if refs:
            page = await read_page(held["sheet"], refs[ref_index], query)
        panel = None
        rows = []
        if page is not None:
            columns_known = page.columns
            for row in page.rows:
                outcomes = row_outcomes(row, page.computed)
                kind, text = row_status(row, run.held_for_budget)
                rows.append(
                    {
                        "seq": row.seq,
                        "status": kind,
                        "status_text": text,
                        "cells": [
                            (i, c, _shown(row.data.get(c)), outcomes.get(c))
                            for i, c in enumerate(page.columns)
                        ],
                    }
                )
            panel = await _panel(params.get("cell"), page, refs[ref_index], run)
        state = {
            k: v
            for k, v in {
                "id": workflow_id,
                "ref": str(ref_index) if refs else "",
                "outcome": query.outcome or "",
                "ocol": query.outcome_column or "",
                "tcol": query.text_column or "",
                "f": params.get("f", "") if query.text else "",
                "sort": query.sort or "",
                "desc": "1" if query.descending else "",
                "page": str(query.page) if query.page else "",
            }.items()
            if v
        }

        def link(**changes: Any) -> str:
            merged = {**state, **{k: str(v) for k, v in changes.items() if v not in (None, "")}}
            for k, v in changes.items():
                if v in (None, ""):
                    merged.pop(k, None)
            return "/sheet?" + urlencode(merged)

        return _render(
            "sheet.html",
            run=run,
            page=page,
            rows=rows,
            panel=panel,
            outcomes=OUTCOMES,
            query=query,
            ref_index=ref_index,
            columns=columns_known,
            link=link,
            state=state,
            said=notes.get(params.get("said")),
            refresh=refresh_s if run.running else None,
        )

    async def _panel(cell: str | None, page: Any, run_ref: str, run: RunSummary) -> Any:
        if not cell or "." not in cell:
            return None
        seq_text, _, index_text = cell.partition(".")
        seq, index = _int(seq_text, -1), _int(index_text, -1)
        if seq < 0 or not 0 <= index < len(page.columns):
            return None
        found = await held["sheet"].read_run_rows(run_ref, seq, seq + 1)
        if not found:
            return None
        row, column = found[0], page.columns[index]
        if column not in page.computed:
            return {"seq": seq, "column": column, "input": True, "panel": None}
        outcome = row_outcomes(row, [column])[column]
        provenance = (row.provenance or {}).get(column)
        return {
            "seq": seq,
            "column": column,
            "input": False,
            "panel": cell_panel(column, OUTCOMES[outcome], provenance, run.prices),
        }

    async def charts_page(request: Request) -> Response:
        picked = await picked_run(request.query_params)
        if isinstance(picked, Response):
            return picked
        run, ref_index = picked
        refs = run.run_refs
        charts = None
        if refs:
            charts = await read_charts(held["sheet"], refs[ref_index], await desk.budget(run))
        estimate = await desk.estimate(run)
        return _render(
            "charts.html",
            run=run,
            charts=charts,
            estimate=estimate,
            estimated=beside(estimate, run.providers, run.prices) if estimate else [],
            ref_index=ref_index,
            when=iso_utc,
            refresh=refresh_s * 10 if run.running else None,  # a picture: slower reloads
        )

    async def text_filter(request: Request) -> Response:
        """A typed filter: its text kept here, the page's URL carries its id only."""
        form = await _form(request)
        state = {
            k: str(v)
            for k, v in form.items()
            if k in ("id", "ref", "outcome", "ocol", "sort", "desc")
        }
        text = str(form.get("text") or "").strip()
        column = str(form.get("tcol") or "")
        if text and column:
            state["tcol"], state["f"] = column, notes.keep(text)
        return RedirectResponse("/sheet?" + urlencode({k: v for k, v in state.items() if v}), 303)

    async def act(request: Request) -> Response:
        form = await _form(request)
        workflow_id = str(form.get("id") or "")
        action = str(form.get("action") or "")
        back = {"id": workflow_id, **({"ref": str(form["ref"])} if form.get("ref") else {})}
        if action not in ACTIONS:
            said = f"unknown action {action!r}; one of {', '.join(ACTIONS)}"
        else:
            amount = None
            if action == "budget":
                try:
                    amount = float(str(form.get("add") or ""))
                except ValueError:
                    amount = None
            try:
                said = await desk.act(workflow_id, action, amount)
            except PlaylineError as err:
                said = str(err)
        back["said"] = notes.keep(said)
        return RedirectResponse("/sheet?" + urlencode(back), 303)

    async def export(request: Request) -> Response:
        params = request.query_params
        workflow_id = params.get("id", "")
        choice = ExportChoice(
            fmt="jsonl" if params.get("fmt") == "jsonl" else "csv",
            provenance=params.get("provenance") == "1",
            changes=params.get("changes") == "1",
        )
        folder = Path(tempfile.mkdtemp(prefix="playline-ui-"))
        path = folder / f"export.{choice.fmt}"
        try:
            await desk.export(workflow_id, path, choice)
        except PlaylineError as err:
            _remove(folder)
            return _render("error.html", 400, message=str(err))
        name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in workflow_id)
        return FileResponse(
            path,
            filename=f"{name}{'-changes' if choice.changes else ''}.{choice.fmt}",
            background=BackgroundTask(_remove, folder),
        )

    return Starlette(
        routes=[
            Route("/", runs_page),
            Route("/sheet", sheet_page),
            Route("/charts", charts_page),
            Route("/filter", text_filter, methods=["POST"]),
            Route("/act", act, methods=["POST"]),
            Route("/export", export),
            Mount("/static", StaticFiles(packages=[("playline.webview", "static")]), name="static"),
        ],
        middleware=[Middleware(Guard, token=token, hosts=hosts or [])],
        lifespan=lifespan,
    )


#: The largest form body read (a filter or a button: a few hundred bytes).
MAX_FORM_BYTES = 16 * 1024


async def _form(request: Request) -> dict[str, str]:
    """A posted form (``application/x-www-form-urlencoded``, as every form here is),
    read up to :data:`MAX_FORM_BYTES`; the first value of each field."""
    try:
        body = await read_capped_body(request, MAX_FORM_BYTES)
    except BodyTooLarge:
        return {}
    fields: dict[str, str] = {}
    for key, value in parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True):
        fields.setdefault(key, value)
    return fields


def _shown(value: Any) -> str:
    """A cell as text (nested values as compact JSON), cut for the grid."""
    if value is None:
        return ""
    if isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    else:
        text = str(value)
    return text if len(text) <= 120 else text[:119] + "…"


def _remove(folder: Path) -> None:
    for child in folder.iterdir():
        child.unlink(missing_ok=True)
    folder.rmdir()
