"""A local fake of paid, rate-limited GTM data providers.

``acme`` and ``firmo`` bill per request; ``mailfox`` (per hit), ``prospectr`` (refund on a
miss, per field found) and ``verifly`` (per request) bill like real enrichment APIs,
and ``hunter``, ``findymail``, ``prospeo`` and ``apollo`` answer in those vendors'
documented shapes for the catalog presets. The ledger counts the ``credits`` billed.

The demo, the tests and the benchmarks call it over real HTTP on 127.0.0.1, and
read its ledger to check from the provider's side that nothing was paid for
twice and no limit was exceeded. It can honour ``Idempotency-Key`` (``"key"``) or
ignore it like most real enrichment APIs (``"ignore"``), and inject faults that
charge and then fail to answer; the ledger says which charged calls were never
answered, and why. See ``app`` for the request pipeline, ``config`` for the
knobs, ``ledger`` for what is counted, ``process`` for starting it.
"""

from playline.provider_server.app import ENDPOINTS, ProviderServer, create_app
from playline.provider_server.config import ServerConfig, key_digest
from playline.provider_server.ledger import UNANSWERED_REASONS, Ledger, idem_digest
from playline.provider_server.process import (
    ProviderServerError,
    ProviderServerProcess,
    ThreadedProviderServer,
    start_in_thread,
)
from playline.sockets import free_port

__all__ = [
    "ENDPOINTS",
    "UNANSWERED_REASONS",
    "Ledger",
    "ProviderServer",
    "ProviderServerError",
    "ProviderServerProcess",
    "ServerConfig",
    "ThreadedProviderServer",
    "create_app",
    "free_port",
    "idem_digest",
    "key_digest",
    "main",
    "start_in_thread",
]


def main(argv: list[str] | None = None) -> int:
    """Run the server from the command line (see ``python -m playline.provider_server -h``)."""
    from playline.provider_server.__main__ import main as cli_main

    return cli_main(argv)
