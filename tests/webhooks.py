"""What the webhook receiver's tests share: a catalog with webhook tools, jobs, signatures.

``lateco`` is shaped like FullEnrich (batched submits, per-contact progress, deliveries
signed with HMAC-SHA1 of the body); ``plainco`` calls back unsigned (the per-job token
in the URL is its only secret); ``pollco`` is polled only.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from playline.calls.catalog import Catalog
from playline.stores.jobs import Job, JobStore
from playline.webhook.verify import sign

SECRET_ENV = "LATECO_WEBHOOK_SECRET"
SECRET = "whsec-test-0123456789"
SIGNATURE_HEADER = "X-Lateco-Signature"

CATALOG_TOML = f"""
[providers.lateco]
base_url = "http://127.0.0.1:9"

[providers.plainco]
base_url = "http://127.0.0.1:9"

[providers.pollco]
base_url = "http://127.0.0.1:9"

[tools.lateco_enrich]
provider = "lateco"
path = "/v2/contact/enrich/bulk"
input = {{ first_name = "str", domain = "str" }}

[tools.lateco_enrich.job]
items_field = "data"
max_items = 100
id_field = "custom.row"
job_id = "enrichment_id"
status_path = "/v2/contact/enrich/bulk/{{job_id}}"
state_field = "status"
done = ["FINISHED"]
running = ["CREATED", "IN_PROGRESS"]
failed = ["CANCELED", "CREDITS_INSUFFICIENT"]
reason_field = "error"
results_field = "datas"
partial = true
webhook = {{ url_field = "webhook_url", signature = "hmac-sha1", \
signature_header = "{SIGNATURE_HEADER}", secret_env = "{SECRET_ENV}" }}

[tools.plain_enrich]
provider = "plainco"
path = "/batch"
input = {{ email = "str" }}

[tools.plain_enrich.job]
job_id = "request_id"
status_path = "/batch/{{job_id}}"
state_field = "success"
done = [true]
running = [false]
results_field = "data"
webhook = {{ url_field = "custom_callback_url" }}

[tools.poll_enrich]
provider = "pollco"
path = "/jobs"
input = {{ email = "str" }}

[tools.poll_enrich.job]
job_id = "id"
status_path = "/jobs/{{job_id}}"
state_field = "state"
done = ["done"]
running = ["running"]
results_field = "result"
"""


def catalog() -> Catalog:
    import tomllib

    return Catalog.model_validate(tomllib.loads(CATALOG_TOML))


def write_catalog(path: Path) -> Path:
    path.write_text(CATALOG_TOML)
    return path


async def open_job(
    jobs: JobStore,
    *,
    tool_id: str = "lateco_enrich",
    provider: str = "lateco",
    waiters: tuple[str, ...] = (),
    members: int = 2,
    job_id: str = "remote",
) -> Job:
    """A submitted (``running``) job of ``tool_id`` with its job id recorded (the one
    :func:`finished` names by default)."""
    key = f"{tool_id}#job:{uuid.uuid4().hex[:16]}"
    refs = [f"{tool_id}:{uuid.uuid4().hex[:12]}" for _ in range(members)]
    job = await jobs.open(
        Job(
            key=key,
            tool_id=tool_id,
            provider=provider,
            request={"method": "POST", "path": "/submit", "body": {"data": []}},
            members=refs,
            waiters=list(waiters),
        )
    )
    assert job.token
    return await jobs.submitted(key, job_id)


def body_bytes(body: Any) -> bytes:
    """A delivery's raw body, as a provider serialises it (not canonical)."""
    return json.dumps(body, indent=1).encode()


def signed(raw: bytes, secret: str = SECRET) -> dict[str, str]:
    """The headers a signing provider sends with ``raw``."""
    return {
        SIGNATURE_HEADER: sign("hmac-sha1", secret.encode(), raw),
        "content-type": "application/json",
    }


def finished(rows: int = 2, job_id: str = "remote") -> dict[str, Any]:
    return {
        "enrichment_id": job_id,
        "status": "FINISHED",
        "datas": [{"custom": {"row": i}, "contact": {"email": f"p{i}@x.co"}} for i in range(rows)],
    }
