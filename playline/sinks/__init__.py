"""Write-back sinks: a run's rows written where GTM teams work (a CRM, a warehouse).

A sink is declared in the catalog (``[sinks.NAME]``; the models are in
:mod:`~playline.sinks.spec`, imported from there) or shipped in a preset
(``include = ["hubspot"]``) and run by ``playline sync RUN_ID --sink NAME`` or
``ctx.sync`` (both through :mod:`~playline.sinks.open`). What a sync writes is
decided per record and field (:mod:`~playline.sinks.plan`: changes only, overwrite
policies, never a blank), remembered in the sync ledger
(:mod:`playline.stores.sync_ledger`), and sent in receipted batches
(:mod:`~playline.sinks.engine`) to a destination: :mod:`~playline.sinks.hubspot` or
:mod:`~playline.sinks.salesforce` (over :mod:`~playline.sinks.crm`), or
:mod:`~playline.sinks.postgres`.
"""
