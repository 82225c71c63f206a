"""The bottom of the house: the databases the stores live in, for SQLite and PostgreSQL.

A store is written once over this package and serves both databases:

* :mod:`~playline.db.conn` - ``Conn``: ``execute``, ``one``, ``all``, ``scalar``,
  ``many`` with ``?`` placeholders; store logic is plain functions ``fn(conn) -> T``;
* :mod:`~playline.db.engine` - the ``Database`` protocol: ``read(fn)``, ``write(fn)``
  (one transaction, re-run on a lost race), ``migrate(schema)``;
  :mod:`~playline.db.sqlite` (a thread per file, group commit) and
  :mod:`~playline.db.postgres` (a pool, a worker thread per call) implement it;
* :mod:`~playline.db.dialect` - the small table of what differs (``FOR UPDATE``,
  DDL type names, the clock, placeholder spelling);
* :mod:`~playline.db.migrations` - versioned schemas (``PRAGMA user_version`` per
  file; ``playline_schema`` per component);
* :mod:`~playline.db.ready` - a store's database opened and migrated by first use;
* :mod:`~playline.db.coalesce` - group commit; :mod:`~playline.db.errors` - what can
  be wrong with where the stores live; :mod:`~playline.db.urls` - URLs without
  passwords.

Only this package imports ``sqlite3`` and ``psycopg`` (and the store modules not
moved onto it yet).
"""
