"""A play cannot make its worker read what the worker was not told it may, end to end.

Whoever can start a play names the files and URLs its worker reads. A worker reads
local files only under its ``PLAYLINE_DATA_DIRS`` (the tests set their temporary
directory and the repository) and downloads CSV URLs only when allowed, never from a
private address. A refusal is one line, in the play's failure, quoting nothing of what
it refused to read; a worker secret appears nowhere, not in the failure, the play's
history or the command's output.
"""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from playline.contract import PlayRunResult, RunOptions
from playline.errors import root_cause
from tests.conftest import new_id, start_worker_process
from tests.e2e.test_bad_input import assert_nothing_dispatched, fails_with
from tests.e2e.test_cli_failures import playline
from tests.plays import lead, run, write_csv

#: A secret only the worker process holds (in its environment, so in /proc/self/environ).
PROBE = "sk_live_PROBE_7f3a9c0e51d24b6c"


async def history_json(client: Client, workflow_id: str) -> str:
    return (await client.get_workflow_handle(workflow_id).fetch_history()).to_json()


async def test_a_play_naming_proc_self_environ_fails_in_one_line_and_leaks_nothing(
    client, provider, temporal_address, task_queue, tmp_path
) -> None:
    home = tmp_path / "home"
    log = tmp_path / "worker.log"
    # A symlink inside a data directory does not lead out of it either.
    link = tmp_path / "innocent.csv"
    link.symlink_to("/proc/self/environ")
    worker = start_worker_process(
        temporal_address, task_queue, home, log, env={"ACME_API_KEY": PROBE}
    )
    try:
        ran = await playline(
            "run", "t_tool_column", "--input", '{"csv_path": "/proc/self/environ"}',
            "--id", "environ-run", "--address", temporal_address, "--task-queue", task_queue,
            home=home, timeout_s=120,
        )  # fmt: skip
        linked_id = new_id("environ-link")
        linked = await fails_with(
            client, task_queue, "t_tool_column", {"csv_path": str(link)}, workflow_id=linked_id
        )
    finally:
        worker.terminate()
        worker.wait(timeout=10)
    output = ran.stdout + ran.stderr
    assert ran.returncode == 1, output
    [line] = [x for x in output.splitlines() if "play failed" in x]
    assert line == (
        "play failed: CSV path '/proc/self/environ' is not in any of this worker's "
        "PLAYLINE_DATA_DIRS; upload it with `playline run --csv` (a store: reference), or "
        "add its directory to PLAYLINE_DATA_DIRS on the workers"
    )
    assert linked.type == "InvalidPlayInput"
    assert linked.message.startswith(f"CSV path {str(link)!r} is not in any of this worker's")
    for text in (
        output,
        linked.message,
        await history_json(client, "environ-run"),
        await history_json(client, linked_id),
    ):
        assert PROBE not in text
        assert "PATH=" not in text  # nothing of the environment at all
    assert_nothing_dispatched(provider)


class _CountingFiles(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def log_message(self, *args: object) -> None:
        return None

    def do_GET(self) -> None:
        type(self).requests.append(self.path)
        super().do_GET()


@pytest.fixture
def loopback_files(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    """A file server on 127.0.0.1 serving a good CSV at ``/x.csv``; the paths it was asked."""
    root = tmp_path / "www"
    root.mkdir()
    write_csv(root / "x.csv", [lead(n) for n in range(3)])
    seen: list[str] = []
    handler = type("Files", (_CountingFiles,), {"requests": seen})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a: handler(*a, directory=str(root))
    )
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


async def test_a_loopback_csv_url_is_refused_in_one_line_and_nothing_is_loaded(
    client, provider, worker, task_queue, loopback_files
) -> None:
    base, seen = loopback_files
    url = f"{base}/x.csv?sig=SECRET"
    async with worker(url_loads=True):
        cause = await fails_with(client, task_queue, "t_tool_column", {"csv_path": url})
    assert cause.type == "InvalidPlayInput"
    assert cause.message == (
        f"CSV URL {base}/x.csv?…: 127.0.0.1 is not a public address; CSV URLs reach public "
        "addresses only; add the host to PLAYLINE_URL_ALLOW_HOSTS on the workers if it is a "
        "server you trust"
    )
    assert seen == []  # refused before connecting: nothing was read, nothing loaded
    assert_nothing_dispatched(provider)


async def test_csv_urls_are_off_unless_the_workers_allow_them(
    client, provider, worker, task_queue, loopback_files
) -> None:
    base, seen = loopback_files
    async with worker():
        off = await fails_with(client, task_queue, "t_tool_column", {"csv_path": f"{base}/x.csv"})
    assert off.message.startswith(
        f"CSV URL {base}/x.csv: this worker does not download CSV URLs; set "
        "PLAYLINE_URL_LOADS=on on the workers"
    )
    assert seen == []
    async with worker(url_loads=True, url_allow_hosts=("127.0.0.1",)):
        result = await run_ok(client, task_queue, {"csv_path": f"{base}/x.csv"})
    assert result.datasets[0].stats.rows_ok == 3
    assert seen == ["/x.csv"]


async def run_ok(client: Client, task_queue: str, play_input: dict[str, str]) -> PlayRunResult:
    result: PlayRunResult = await run(client, "t_tool_column", play_input, task_queue=task_queue)
    return result


async def test_fixture_paths_outside_the_data_dirs_are_refused(
    client, provider, worker, task_queue, tmp_path
) -> None:
    path = write_csv(tmp_path / "leads.csv", [lead(n) for n in range(2)])
    options = RunOptions(integration_mode="fixture", fixtures=["/etc/passwd"])
    async with worker():
        with pytest.raises(Exception) as info:
            await run(
                client,
                "t_tool_column",
                {"csv_path": str(path)},
                task_queue=task_queue,
                options=options,
            )
    cause = root_cause(info.value)
    assert getattr(cause, "message", "") == (
        "fixture path '/etc/passwd' is not in any of this worker's PLAYLINE_DATA_DIRS; add "
        "its directory to PLAYLINE_DATA_DIRS on the workers"
    )
    assert "root:" not in str(cause)
    assert_nothing_dispatched(provider)
