"""What the Temporal UI shows of a play and a dataset run: the Markdown, and the spacing
of progress reports, as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from playline.contract import (
    ChunkStats,
    ColumnSpec,
    DatasetRunState,
    PlayState,
    PreparedRun,
    ProviderPace,
    ProviderWait,
    RunOptions,
)
from playline.search_attributes import ALL_KEYS, dev_server_flags, type_name
from playline.workflows.dataset_run import report_interval
from playline.workflows.status import (
    change_lines,
    dataset_current_details,
    dataset_static,
    play_current_details,
    play_static,
    waits_of,
)

NOW = datetime(2026, 12, 3, 14, 5, 9, tzinfo=UTC)


def run_state(**changes: object) -> DatasetRunState:
    state = DatasetRunState(
        dataset="enriched_leads",
        rows_total=240,
        rows_done=120,
        chunks_in_flight=2,
        window=4,
        stats=ChunkStats(
            rows_ok=117,
            rows_failed=3,
            rows_cached=40,
            calls_made=230,
            calls_cached=70,
            calls_shared=10,
            credits=245.5,
        ),
        ranges=[(120, 145), (145, 170)],
        paces=[ProviderPace(provider="acme", rate_rps=20.0), ProviderPace(provider="firmo")],
    )
    return state.model_copy(update=changes)


def test_a_play_summary_names_the_play_its_file_and_mode() -> None:
    summary, details = play_static(
        "enrich_leads", {"csv_path": "/data/leads.csv", "mode": "upsert"}, RunOptions()
    )
    assert summary == "enrich_leads · leads.csv · live"
    assert "- input file: `/data/leads.csv`" in details
    assert '- input: `{"csv_path": "/data/leads.csv", "mode": "upsert"}`' in details
    assert "- chunks: chunks sized to about 5 s" in details
    fixture, _ = play_static(
        "p", {"x": 1}, RunOptions(integration_mode="fixture", fixtures=["/f/a.jsonl"])
    )
    assert fixture == "p · fixture mode"
    assert "sheet" not in details
    _, linked = play_static("p", {}, RunOptions(), sheet="http://127.0.0.1:8234/sheet?id=wf")
    assert linked.endswith("\n- sheet: [its rows, cell by cell](http://127.0.0.1:8234/sheet?id=wf)")


def test_a_long_input_is_elided_in_the_static_details() -> None:
    _, details = play_static("p", {"csv_path": "x" * 1000}, RunOptions(chunk_size=50))
    line = next(line for line in details.splitlines() if line.startswith("- input: "))
    assert len(line) < 320 and line.endswith("…`")
    assert "- chunks: 50 rows per chunk" in details


def test_a_dataset_run_summary_has_its_rows_source_and_mode() -> None:
    prepared = PreparedRun(
        run_ref="r",
        dataset="enriched_leads",
        total=240,
        admitted=236,
        duplicates=4,
        seen_before=0,
        providers=["acme", "firmo"],
    )
    summary, details = dataset_static(
        play="enrich_leads",
        name="enriched_leads",
        prepared=prepared,
        source_id="leads@ab",
        source_path="/data/leads.csv",
        mode="upsert",
        key_fields=["lead_id"],
        columns=[ColumnSpec(name="work_email", resolver="m.work_email")],
        options=RunOptions(),
    )
    assert summary == "enriched_leads: 236 rows of leads.csv (upsert, live)"
    assert "- rows: 236 admitted of 240 (4 duplicate keys)" in details
    assert "- mode: upsert, live; key: lead_id" in details
    assert "- providers: acme, firmo" in details


def test_current_details_of_a_running_dataset_run() -> None:
    text = dataset_current_details(run_state(), NOW)
    assert text.splitlines()[0] == (
        "**running** enriched_leads · 120 of 240 rows done (3 failed, 40 cached)"
    )
    assert "- 2 of 4 chunks in flight (rows 120-144, 145-169)" in text
    assert "- calls: 230 made, 80 saved (70 receipt hits, 10 shared)" in text
    assert "- credits: 245.5" in text
    assert "- acme: 20 rps in force" in text and "- firmo: not paced in force" not in text
    assert "- firmo: not paced" in text
    assert text.endswith("- updated 14:05:09 UTC")


def test_a_wait_is_shown_per_provider_with_its_end() -> None:
    paces = [ProviderPace(provider="acme", rate_rps=10.0, paused_s=12.0)]
    waits = waits_of(paces, NOW)
    assert waits == [ProviderWait(provider="acme", until=NOW + timedelta(seconds=12))]
    text = dataset_current_details(run_state(paces=paces, waits=waits), NOW)
    assert "- acme: 10 rps in force, waiting for rate limited until 14:05:21 UTC" in text
    quota = ProviderWait(provider="acme", until=datetime(2026, 12, 4, tzinfo=UTC), reason="quota")
    parked = dataset_current_details(
        run_state(status="waiting", paces=[], waits=[quota], chunks_in_flight=0, ranges=[]), NOW
    )
    assert parked.startswith("**waiting** enriched_leads")
    assert "- acme: waiting for quota until Dec 4 00:00 UTC" in parked


def test_an_ended_run_shows_no_window_and_a_paused_one_says_how_to_go_on() -> None:
    done = dataset_current_details(run_state(status="completed", rows_done=240), NOW)
    assert "chunks in flight" not in done and done.startswith("**completed**")
    paused = dataset_current_details(run_state(status="paused", paused=True), NOW)
    assert "- dispatch paused: chunks in flight finish, no new ones start (resume)" in paused


def test_current_details_of_a_play_include_its_runs_report_and_its_failure() -> None:
    state = PlayState(
        play="enrich_leads",
        phase="running enriched_leads",
        status="running",
        rows_total=240,
        rows_done=120,
        current_dataset="enriched_leads",
        current=run_state(),
        window=3,
    )
    text = play_current_details(state, run_state().stats, NOW)
    assert text.splitlines()[0] == "**running** enriched_leads · 120 of 240 rows done"
    assert "- 2 of 4 chunks in flight (rows 120-144, 145-169)" in text
    assert "- acme: 20 rps in force" in text
    assert "- window: at most 3 chunks in flight (set_window)" in text
    failed = state.model_copy(update={"status": "failed", "phase": "failed"})
    text = play_current_details(failed, ChunkStats(), NOW, "row 'T1' failed: boom")
    assert "- failed: row 'T1' failed: boom" in text and "chunks in flight" not in text


def test_progress_reports_space_out_as_a_run_ages() -> None:
    assert report_interval(timedelta(seconds=5)) == timedelta(seconds=10)
    assert report_interval(timedelta(minutes=50)) == timedelta(minutes=1)
    assert report_interval(timedelta(days=1)) == timedelta(minutes=10)
    # A day-long run reports a few hundred times, not once every 10 seconds (8640).
    age, reports = timedelta(0), 0
    while age < timedelta(days=1):
        age += report_interval(age)
        reports += 1
    assert reports < 400


def test_search_attribute_keys_and_their_dev_server_flags() -> None:
    assert [(k.name, type_name(k)) for k in ALL_KEYS] == [
        ("PlaylinePlay", "Keyword"),
        ("PlaylineStatus", "Keyword"),
        ("PlaylineRowsTotal", "Int"),
        ("PlaylineRowsDone", "Int"),
        ("PlaylineRowsFailed", "Int"),
        ("PlaylineCredits", "Double"),
        ("PlaylineKind", "Keyword"),
    ]
    assert dev_server_flags()[:4] == [
        "--search-attribute",
        "PlaylinePlay=Keyword",
        "--search-attribute",
        "PlaylineStatus=Keyword",
    ]


def test_jobs_a_run_waits_on_are_shown_per_provider_with_the_oldest_age() -> None:
    jobs = {
        "fullenrich": {
            "pending": 3,
            "finished": 10,
            "failed": 1,
            "oldest_pending_at": (NOW - timedelta(seconds=42)).timestamp(),
        },
        "dropcontact": {"pending": 0, "finished": 2, "failed": 0, "oldest_pending_at": None},
    }
    stats = run_state().stats.model_copy(update={"jobs": jobs})
    text = dataset_current_details(run_state(stats=stats), NOW)
    assert "- fullenrich jobs: 3 pending (oldest 42 s), 10 finished, 1 failed" in text
    assert "- dropcontact jobs: 0 pending, 2 finished, 0 failed" in text
    # A later chunk's count replaces the earlier one (a snapshot, not a sum).
    total = ChunkStats(jobs=jobs)
    total.add(ChunkStats(jobs={"fullenrich": {**jobs["fullenrich"], "pending": 1}}))
    assert total.jobs["fullenrich"]["pending"] == 1 and "dropcontact" in total.jobs


def test_a_play_shows_what_it_changed_and_what_was_due_before_paying() -> None:
    state = PlayState(
        play="enrich_leads",
        status="completed",
        phase="finished leads",
        due={
            "cells_due": 12,
            "cells_fresh": 30,
            "calls": 12,
            "worst_case": 14.5,
            "estimate_id": "e-1",
        },
    )
    changes = {
        "work_email": {"changed": 3, "appeared": 1, "disappeared": 0},
        "title": {"changed": 0, "appeared": 0, "disappeared": 2},
    }
    text = play_current_details(state, ChunkStats(changes=changes), NOW)
    assert "- due before paying: 12 cells (30 fresh), worst case 14.5 credits" in text
    assert (
        "- changed since the previous run: title 0 changed, 0 appeared, 2 disappeared; "
        "work_email 3 changed, 1 appeared, 0 disappeared"
    ) in text
    # A first run (nothing to compare with) and a run that was not estimated say neither.
    plain = play_current_details(state.model_copy(update={"due": None}), ChunkStats(), NOW)
    assert "changed since" not in plain and "due before paying" not in plain
    # A dataset enriched before whose re-run changed nothing says so, with zeros.
    same = {"work_email": {"changed": 0, "appeared": 0, "disappeared": 0}}
    assert change_lines(same) == [
        "changed since the previous run: work_email 0 changed, 0 appeared, 0 disappeared"
    ]


def test_the_cells_kept_fresh_are_counted_beside_those_computed() -> None:
    from playline.workflows.status import fresh_lines

    assert fresh_lines(ChunkStats(cells_due=30)) == []  # nothing kept: nothing to say
    assert fresh_lines(ChunkStats(cells_due=12, cells_fresh=228)) == [
        "cells: 12 computed, 228 kept fresh (no call made)"
    ]


def test_a_shared_provider_says_this_runs_part() -> None:
    from playline.contract import ProviderPace
    from playline.workflows.status import share_text

    alone = ProviderPace(provider="acme", rate_rps=40, share_rps=39.0, sharing=1)
    assert share_text(alone) == ""
    shared = ProviderPace(
        provider="acme", rate_rps=40, share_rps=25.1, share_part=0.66, total_rps=38, sharing=2
    )
    assert share_text(shared) == "; this run 25.1 rps (66%) of 38 rps, shared by 2"


def test_a_pace_says_how_its_limit_was_learnt_and_since_when() -> None:
    paces = [
        ProviderPace(
            provider="acme",
            rate_rps=24.0,
            limit_source="429 measurement",
            limit_since="2026-12-06T14:04:50Z",
        ),
        ProviderPace(provider="firmo", rate_rps=5.0),
    ]
    text = dataset_current_details(run_state(paces=paces, waits=[]), NOW)
    assert "- acme: 24 rps in force (limit from 429 measurement since 2026-12-06T14:04:50Z)" in text
    assert "- firmo: 5 rps in force" in text and "firmo: 5 rps in force (" not in text
