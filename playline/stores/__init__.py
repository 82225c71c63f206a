"""Where rows and receipts live, outside workflow history. No Temporal in here.

* :mod:`~playline.stores.receipts` - the receipt store's contract (content
  addresses, leases, the claim rule); :mod:`~playline.stores.receipts_sqlite` its
  SQLite backend;
* :mod:`~playline.stores.sheet` - the sheet store's contract (sources, sheet rows,
  run manifests); :mod:`~playline.stores.sheet_sqlite` its SQLite backend;
* :mod:`~playline.stores.sqlite_db` - the SQLite connection both backends share;
* :mod:`~playline.stores.csv_io` - strict CSV in, CSV/JSONL out;
* :mod:`~playline.stores.export` - a run's rows out: export files, preview, inline rows.
"""
