"""Every ``@activity.defn`` of playline, and nothing else.

* :mod:`~playline.activities.chunk` - ``playline.run_chunk``: resolvers over a range of rows;
* :mod:`~playline.activities.datasets` - loads, run preparation, finalize, peek, export;
* :mod:`~playline.activities.scalar` - ``ctx.tool`` and ``ctx.step``;
* :mod:`~playline.activities.budgets` - ``playline.adjust_budget``: a run's budget cap;
  ``playline.end_run_budgets``: a run's reservations settled or released when it ends;
* :mod:`~playline.activities.balances` - ``playline.read_balances``: each provider's
  balance before and after a run (``playline runs reconcile``);
* :mod:`~playline.activities.estimate` - ``playline.estimate_chunk`` (and scalar calls):
  what a run would cost, counted from receipts, nothing sent;
* :mod:`~playline.activities.sync` - ``playline.sync_dataset``: ``ctx.sync``, a run written
  back to a sink;
* :mod:`~playline.activities.width` - the governor's dispatch width (a local activity);
* :mod:`~playline.activities.visibility` - which search attributes the namespace has (local).

Each class takes the worker's ``ServicesHolder``; ``PlaylinePlugin`` registers
their methods. Workflows call them by reference to these methods
(``workflow.execute_activity_method(DatasetActivities.load_csv, ...)``).
"""

from __future__ import annotations

from playline.activities.balances import BalanceActivities
from playline.activities.budgets import BudgetActivities
from playline.activities.chunk import ChunkActivities
from playline.activities.datasets import DatasetActivities
from playline.activities.estimate import EstimateActivities
from playline.activities.scalar import ScalarActivities
from playline.activities.sync import SyncActivities
from playline.activities.visibility import VisibilityActivities
from playline.activities.width import WidthActivities

__all__ = [
    "BalanceActivities",
    "BudgetActivities",
    "ChunkActivities",
    "DatasetActivities",
    "EstimateActivities",
    "ScalarActivities",
    "SyncActivities",
    "VisibilityActivities",
    "WidthActivities",
]
