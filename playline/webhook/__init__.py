"""``playline webhook``: receives asynchronous providers' job callbacks.

An asynchronous tool whose provider calls back (a catalog tool's ``job.webhook``)
submits each job with a callback URL ``$PLAYLINE_WEBHOOK_URL/hooks/<provider>/<token>``
(``token``: the job's per-job secret). The receiver (:func:`webhook_app`, served by
``playline webhook``) checks the delivery (the token, the provider's signature),
stores the job's status in the job ledger once per distinct delivery, and signals
the dataset runs waiting on the job (``jobs_ready``). Polling stays the fallback: a
lost or refused delivery costs time, not rows.
"""

from __future__ import annotations

from playline.webhook.app import MAX_BODY_BYTES, Notify, delivery_digest, webhook_app, webhook_tools
from playline.webhook.verify import WebhookSecretMissing, sign, signature_matches, signing_secret

__all__ = [
    "MAX_BODY_BYTES",
    "Notify",
    "WebhookSecretMissing",
    "delivery_digest",
    "sign",
    "signature_matches",
    "signing_secret",
    "webhook_app",
    "webhook_tools",
]
