"""Where rows and receipts live, outside workflow history. No Temporal in here.

* :mod:`~playline.stores.backends` - ``open_stores(settings, create=...)``: the
  stores from ``PLAYLINE_STORE_URL`` (SQLite files or one PostgreSQL database);
* :mod:`~playline.stores.receipts` - the receipt store's contract (content
  addresses, leases, the claim rule); :mod:`~playline.stores.receipts_ledger` its one
  implementation, over :mod:`playline.db`, and :mod:`~playline.stores.journal` the
  paid answers it would not take yet;
* :mod:`~playline.stores.sheet` - the sheet store's contract (sources, sheet rows,
  run manifests); :mod:`~playline.stores.sheet_ledger` its one implementation, over
  :mod:`playline.db`;
* :mod:`~playline.stores.budgets` - the budget ledger's contract (reservations
  against run, provider and named budgets; periods); :mod:`~playline.stores.budgets_ledger`
  its one implementation, over :mod:`playline.db`, and
  :mod:`~playline.stores.budgets_group` the rule every batch of reservations follows;
* :mod:`~playline.stores.jobs` - the job ledger's contract (asynchronous provider
  jobs, their members, waiters and webhook deliveries); :mod:`~playline.stores.jobs_ledger`
  its one implementation, over :mod:`playline.db`;

Loading CSVs and URLs into a source, exporting a run's rows and what a worker may
read are dataset I/O, not storage: they live in :mod:`playline.datasets`.
"""
