"""Payload encryption end to end: history at rest is ciphertext, the UI's codec server
decodes it, and a wrong or missing key is a clear error.

A worker and a client carry ``PLAYLINE_CODEC_KEYS`` (through ``Settings``, or a bare
``PlaylinePlugin()`` reading the variable); the history is then read back with a client
that has no keys, as anyone with access to the server (or its database) would see it.
The codec server answers only its own host names (DNS rebinding), asks for a bearer
token when it has one, caps bodies, and will not serve beyond loopback without a token.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx
import pytest
from google.protobuf.json_format import MessageToDict
from temporalio.api.common.v1 import Payloads
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError

import playline
from playline.cli.devserver import port_open
from playline.codec import ENCODING, KEY_ID, CodecError
from playline.config import Settings
from playline.errors import root_cause
from playline.plugin import PlaylinePlugin
from playline.provider_server.process import free_port
from playline.testing import assert_replays, replay_files
from playline.worker import connect
from tests.conftest import REPO, new_id
from tests.payloads import history_payloads, history_text, payloads_in
from tests.plays import ScalarInput, ToolColumnInput, lead, t_scalar, t_tool_column, write_csv

KEY = base64.b64encode(os.urandom(32)).decode()
SPEC = f"k1:{KEY}"
UI = "http://localhost:8233"
SDK_BOOKKEEPING = {
    EventType.EVENT_TYPE_MARKER_RECORDED,
    EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
}


@contextmanager
def codec_server(spec: str, *args: str, **env: str) -> Iterator[str]:
    """``playline codec-server --port P ARGS`` as a user runs it; its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "playline", "codec-server", "--port", str(port), *args],
        cwd=REPO,
        env={**os.environ, "PLAYLINE_CODEC_KEYS": spec, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not port_open("127.0.0.1", port):
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            assert time.monotonic() < deadline, "the codec server did not start"
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


@pytest.fixture
async def encrypted_run(temporal_address, client, provider, worker, task_queue, tmp_path):
    """A play run by a worker and a client holding the keys: (workflow id, csv path, result)."""
    csv_path = write_csv(tmp_path / "leads.csv", [lead(i) for i in range(6)])
    secure = await connect(temporal_address, settings=Settings.from_env(codec_keys=SPEC))
    workflow_id = new_id("encrypted")
    async with worker(codec_keys=SPEC, data_dirs=(tmp_path,)):  # the CSV is a worker path
        result = await playline.execute_play(
            secure,
            t_tool_column,
            ToolColumnInput(csv_path=str(csv_path)),
            id=workflow_id,
            task_queue=task_queue,
        )
    return workflow_id, str(csv_path), result


async def test_history_at_rest_is_ciphertext_and_the_keyholder_reads_the_typed_result(
    encrypted_run, client
) -> None:
    workflow_id, csv_path, result = encrypted_run
    assert result.output is not None and result.output.rows == 6
    assert len(result.output.preview) == 5 and result.output.preview[0]["last_name"] == "Ln0"

    for wid in (workflow_id, f"{workflow_id}/dataset/t_rows"):
        history = await client.get_workflow_handle(wid).fetch_history()
        # The SDK's own bookkeeping (patch markers, local-activity markers' metadata,
        # the TemporalChangeVersion search attribute) is not encoded by any codec;
        # everything the play put in history is.
        ours = [
            p
            for event in history.events
            if event.event_type not in SDK_BOOKKEEPING
            for p in payloads_in(event)
        ]
        assert len(ours) >= 3, wid
        assert {p.metadata["encoding"] for p in ours} == {ENCODING}
        assert {p.metadata[KEY_ID] for p in ours} == {b"k1"}
        text = history_text(history)
        assert csv_path not in text and "Ln0" not in text and "t_rows" not in text


async def test_failure_messages_are_encrypted_too(
    temporal_address, client, provider, worker, task_queue, tmp_path
) -> None:
    csv_path = write_csv(tmp_path / "leads.csv", [lead(0)])
    secure = await connect(temporal_address, settings=Settings.from_env(codec_keys=SPEC))
    workflow_id = new_id("encrypted-failure")
    async with worker(codec_keys=SPEC, data_dirs=(tmp_path,)):  # the CSV is a worker path
        with pytest.raises(WorkflowFailureError) as failed:
            await playline.execute_play(
                secure,
                t_tool_column,
                ToolColumnInput(csv_path=str(csv_path), column_tool="declared_unknown"),
                id=workflow_id,
                task_queue=task_queue,
            )
    assert "nope" in str(getattr(root_cause(failed.value), "message", ""))
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    [closed] = [
        e for e in history.events if e.HasField("workflow_execution_failed_event_attributes")
    ]
    failure = closed.workflow_execution_failed_event_attributes.failure
    assert failure.message == "Encoded failure"
    assert failure.encoded_attributes.metadata["encoding"] == ENCODING


async def test_a_wrong_or_missing_key_is_a_clear_error(encrypted_run, temporal_address) -> None:
    workflow_id, _, _ = encrypted_run
    other = base64.b64encode(os.urandom(32)).decode()
    for spec, problem in (
        (f"k1:{other}", "key id 'k1' does not decrypt with the key PLAYLINE_CODEC_KEYS holds"),
        (f"k2:{other}", "key id 'k1', which PLAYLINE_CODEC_KEYS does not hold"),
    ):
        wrong = await connect(temporal_address, settings=Settings.from_env(codec_keys=spec))
        with pytest.raises(CodecError, match=problem):
            await playline.get_play_handle(wrong, t_tool_column, workflow_id).result()


async def test_the_codec_server_decodes_history_for_the_ui_and_refuses_other_origins(
    encrypted_run, client
) -> None:
    workflow_id, csv_path, _ = encrypted_run
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    body = MessageToDict(Payloads(payloads=history_payloads(history)))
    headers = {"Origin": UI, "X-Namespace": "default"}
    with codec_server(SPEC) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            preflight = await http.options(
                "/decode",
                headers={
                    "Origin": UI,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type,x-namespace",
                },
            )
            decoded = await http.post("/decode", json=body, headers=headers)
            stranger = await http.options(
                "/decode",
                headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
            )
            encoded = await http.post(
                "/encode",
                json={"payloads": [{"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "MQ=="}]},
                headers=headers,
            )
            round_trip = await http.post("/decode", json=encoded.json(), headers=headers)

    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == UI
    assert decoded.status_code == 200
    assert decoded.headers["access-control-allow-origin"] == UI
    plain = decoded.json()["payloads"]
    assert len(plain) == len(body["payloads"])
    texts = [base64.b64decode(p.get("data", "")).decode() for p in plain]
    assert any(csv_path in t for t in texts)
    assert {base64.b64decode(p["metadata"]["encoding"]) for p in plain} == {b"json/plain"}
    assert stranger.status_code == 400
    assert "access-control-allow-origin" not in stranger.headers
    assert base64.b64decode(encoded.json()["payloads"][0]["metadata"]["encoding"]) == ENCODING
    assert round_trip.json()["payloads"][0]["data"] == "MQ=="


async def test_a_codec_server_with_the_wrong_key_says_so(encrypted_run, client) -> None:
    workflow_id, _, _ = encrypted_run
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    body = MessageToDict(Payloads(payloads=history_payloads(history)[:1]))
    with codec_server(f"k1:{base64.b64encode(os.urandom(32)).decode()}") as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            answer = await http.post("/decode", json=body)
            garbage = await http.post("/decode", content=b"not json")
    assert answer.status_code == 400
    assert "key id 'k1' does not decrypt" in answer.json()["error"]
    assert garbage.status_code == 400 and "expected" in garbage.json()["error"]


async def test_encrypted_histories_replay_with_the_keys_and_say_why_not_without(
    encrypted_run, client, tmp_path
) -> None:
    workflow_id, _, _ = encrypted_run
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    path = tmp_path / "encrypted.json"
    path.write_text(json.dumps(history.to_json_dict()))

    [outcome] = await assert_replays(path, settings=Settings(codec_keys=SPEC))
    assert outcome.workflow_type == "t_tool_column"
    [without] = await replay_files(path)
    assert without.verdict == "failed"
    assert without.message == (
        "Failed decoding arguments: 'Unknown payload encoding binary/encrypted' (the history "
        "is encrypted: set PLAYLINE_CODEC_KEYS to the keys that wrote it)"
    )


async def test_a_bare_plugin_encrypts_with_the_keys_in_the_environment_as_workers_do(
    temporal_address, provider, worker, task_queue, monkeypatch
) -> None:
    monkeypatch.setenv("PLAYLINE_CODEC_KEYS", SPEC)
    bare = await Client.connect(temporal_address, plugins=[PlaylinePlugin()])
    workflow_id = new_id("bare-plugin")
    async with worker():  # Settings.from_env(): the same variable
        result = await playline.execute_play(
            bare, t_scalar, ScalarInput(domain="co1.example"), id=workflow_id, task_queue=task_queue
        )
    assert result.output is not None and result.output.step == {"sum": 5}  # decoded

    raw = await Client.connect(temporal_address)  # no converter, no codec: history as stored
    history = await raw.get_workflow_handle(workflow_id).fetch_history()
    [started] = [
        e for e in history.events if e.HasField("workflow_execution_started_event_attributes")
    ]
    written_by_the_client = list(payloads_in(started))
    assert written_by_the_client, "the start event holds the play's input"
    ours = [
        p
        for event in history.events
        if event.event_type not in SDK_BOOKKEEPING
        for p in payloads_in(event)
    ]
    assert {p.metadata["encoding"] for p in ours} == {ENCODING}
    assert {p.metadata[KEY_ID] for p in ours} == {b"k1"}
    assert "co1.example" not in history_text(history)


NO_PAYLOADS = {"payloads": []}


async def test_the_codec_server_answers_only_requests_naming_its_own_host() -> None:
    with codec_server(SPEC, "--allowed-host", "codec.internal") as url:
        port = url.rsplit(":", 1)[1]
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            answers = {
                host: (await http.post("/decode", json=NO_PAYLOADS, headers={"Host": host}))
                for host in (
                    f"127.0.0.1:{port}",
                    f"localhost:{port}",
                    f"[::1]:{port}",
                    "codec.internal",
                    f"rebound.attacker.example:{port}",
                    "evil.example",
                )
            }
            preflight = await http.options(
                "/decode",
                headers={
                    "Host": f"rebound.attacker.example:{port}",
                    "Origin": UI,
                    "Access-Control-Request-Method": "POST",
                },
            )
    status = {host: answer.status_code for host, answer in answers.items()}
    assert status == {
        f"127.0.0.1:{port}": 200,
        f"localhost:{port}": 200,
        f"[::1]:{port}": 200,
        "codec.internal": 200,
        f"rebound.attacker.example:{port}": 400,
        "evil.example": 400,
    }
    assert "payloads" not in answers["evil.example"].text
    assert preflight.status_code == 400


async def test_with_a_token_the_codec_server_answers_only_the_bearer_of_it() -> None:
    token = base64.urlsafe_b64encode(os.urandom(24)).decode()
    with codec_server(SPEC, PLAYLINE_CODEC_TOKEN=token) as url:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            plain = {"payloads": [{"metadata": {"encoding": "anNvbi9wbGFpbg=="}, "data": "MQ=="}]}
            missing = await http.post("/encode", json=plain, headers={"Origin": UI})
            wrong = await http.post(
                "/decode", json=NO_PAYLOADS, headers={"Authorization": f"Bearer {token}x"}
            )
            basic = await http.post(
                "/decode", json=NO_PAYLOADS, headers={"Authorization": f"Basic {token}"}
            )
            bearer = {"Authorization": f"Bearer {token}", "Origin": UI}
            encoded = await http.post("/encode", json=plain, headers=bearer)
            decoded = await http.post("/decode", json=encoded.json(), headers=bearer)
            # The browser's preflight carries no credentials; it is answered as before.
            preflight = await http.options(
                "/decode",
                headers={
                    "Origin": UI,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "authorization,content-type,x-namespace",
                },
            )
        with codec_server(SPEC, "--token", "from-the-flag") as flagged:
            async with httpx.AsyncClient(base_url=flagged, timeout=10) as http:
                by_flag = await http.post(
                    "/decode", json=NO_PAYLOADS, headers={"Authorization": "Bearer from-the-flag"}
                )
                without = await http.post("/decode", json=NO_PAYLOADS)

    assert [missing.status_code, wrong.status_code, basic.status_code] == [401, 401, 401]
    assert missing.headers["www-authenticate"] == "Bearer"
    assert missing.headers["access-control-allow-origin"] == UI  # the UI can show why
    assert token not in missing.text and "Authorization: Bearer" in missing.json()["error"]
    assert encoded.status_code == 200 and decoded.json()["payloads"][0]["data"] == "MQ=="
    assert preflight.status_code == 200
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
    assert by_flag.status_code == 200 and without.status_code == 401


async def test_the_codec_server_refuses_a_body_over_4_mib() -> None:
    big = b'{"payloads": [{"data": "' + b"A" * (4 * 1024 * 1024) + b'"}]}'

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: read and cut short
        for start in range(0, len(big), 64 * 1024):
            yield big[start : start + 64 * 1024]

    with codec_server(SPEC) as url:
        async with httpx.AsyncClient(base_url=url, timeout=30) as http:
            declared = await http.post(
                "/decode", content=big, headers={"Content-Type": "application/json"}
            )
            streamed = await http.post("/decode", content=chunks())
            small = await http.post("/decode", json={"payloads": [{"data": "QQ=="}]})
    assert declared.status_code == 413 and streamed.status_code == 413
    assert "over 4194304 bytes" in declared.json()["error"]
    assert small.status_code == 200


def test_the_codec_server_will_not_serve_beyond_loopback_without_a_token() -> None:
    port = free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "playline",
            "codec-server",
            "--host",
            "0.0.0.0",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env={**os.environ, "PLAYLINE_CODEC_KEYS": SPEC, "PLAYLINE_CODEC_TOKEN": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 1, output
    assert "refusing to serve decryption on 0.0.0.0 without a token" in output
    assert "--insecure-no-token" in output and len(output.splitlines()) == 1
