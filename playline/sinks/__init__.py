"""Write-back sinks: a run's rows written where GTM teams work (a CRM, a warehouse).

A sink is declared in the catalog (``[sinks.NAME]``, :mod:`~playline.sinks.spec`) or
shipped in a preset (``include = ["hubspot"]``) and run by ``playline sync RUN_ID
--sink NAME``. What a sync writes is decided per record and field
(:mod:`~playline.sinks.plan`: changes only, overwrite policies, never a blank),
remembered in the sync ledger (:mod:`playline.stores.sync_ledger`), and sent in
receipted batches (:mod:`~playline.sinks.engine`) to a destination:
:mod:`~playline.sinks.hubspot`, :mod:`~playline.sinks.salesforce` or
:mod:`~playline.sinks.postgres`.
"""

from playline.sinks.spec import (
    FieldPolicy,
    HubSpotSinkSpec,
    PostgresSinkSpec,
    SalesforceSinkSpec,
    SinkSpec,
    VerifiedRule,
)

__all__ = [
    "FieldPolicy",
    "HubSpotSinkSpec",
    "PostgresSinkSpec",
    "SalesforceSinkSpec",
    "SinkSpec",
    "VerifiedRule",
]
