"""Reconciliation: what playline says a run cost, checked against what the provider says.

Three figures per provider, each from a different witness:

* **playline's**: the credits the run's receipts record for the answers its rows paid
  for (the figure the cells and the budget show);
* **reported**: of those, the credits the provider itself reported with the answer (a
  charged-credits header, a ``total_cost`` field: the tool's ``billing.charged_*``);
  the rest were computed from the catalog's billing rule;
* **the balance**: the provider's account read before the run's first call and after
  its last (the provider's ``balance`` in the catalog), whose difference is what the
  provider actually took.

``compare`` (pure) lines them up and names the calls behind any difference;
``gather`` reads them from the stores; ``read`` asks a provider for its balance,
once per run and phase (the readings are receipted like calls).
"""
