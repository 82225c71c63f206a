"""Datasets in and out: what a play reads its rows from and writes its results to.

The stores (:mod:`playline.stores`) keep rows; this room moves them across the
package's edge, through the stores, never around them:

* :mod:`~playline.datasets.load` - a source into the sheet store: a local CSV
  (:func:`upload_csv`), a ``store:<id>`` reference to one already there
  (:func:`store_source`, :func:`find_source`), or a URL streamed to a file first
  (:func:`download_csv`);
* :mod:`~playline.datasets.access` - the policy of what a play may make a worker
  read: local paths only under ``PLAYLINE_DATA_DIRS`` (:func:`check_worker_path`,
  :func:`check_fixture_paths`), URLs only when allowed and only to public addresses;
* :mod:`~playline.datasets.csv_io` - strict, streaming CSV in; CSV/JSONL out,
  atomically, with spreadsheet formulas made inert;
* :mod:`~playline.datasets.export` - a run's rows out: export files (optionally
  with each cell's provenance), the changes a re-run made, the preview and the
  inline result.

It imports only downward (the stores, ``config``, ``errors``, ``contract``), never
activities, workflows, the command line or the demo. Below are the names the rest
of the package and users need; the modules hold the rest.
"""

from playline.datasets.access import check_fixture_paths, check_worker_path
from playline.datasets.csv_io import cell_text
from playline.datasets.export import export_changes, export_run, row_out, summarize_run
from playline.datasets.load import (
    SourceUnavailable,
    download_csv,
    find_source,
    is_url,
    shown_url,
    store_source,
    store_source_id,
    upload_csv,
)

__all__ = [
    "SourceUnavailable",
    "cell_text",
    "check_fixture_paths",
    "check_worker_path",
    "download_csv",
    "export_changes",
    "export_run",
    "find_source",
    "is_url",
    "row_out",
    "shown_url",
    "store_source",
    "store_source_id",
    "summarize_run",
    "upload_csv",
]
