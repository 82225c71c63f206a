"""The balance endpoints: each provider's account as its vendor reports it.

A balance is the account's ``starting_balance`` (``ServerConfig``) less what the
ledger billed the provider since the last reset, net of refunds, so a test knows what
playline should read before and after a run, and a charge the client never saw (a
charged fault: "charged then dropped") shows up in it, as at a real provider.

The vendor shapes follow their documents (each a free GET with the provider's key):

* Hunter ``GET /v2/account``: a usage counter, ``data.requests.searches.used`` of
  ``available``;
* Findymail ``GET /api/credits``: ``{"credits": N, "verifier_credits": N}``;
* Prospeo ``GET /account-information``: ``response.remaining_credits`` and
  ``used_credits``;
* FullEnrich ``GET /api/v1/account/credits`` and ``/api/v2/account/credits``:
  ``{"balance": N}``;
* the made-up providers (``acme``, ``firmo``, ``mailfox``, ``prospectr``,
  ``verifly``) ``GET /v1/account/balance``: ``{"credits_remaining", "credits_used"}``.

Apollo and Dropcontact document no balance endpoint (Dropcontact reports
``credits_left`` in its answers), so they have none here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["BALANCE_ROUTES", "BalanceRoute"]

#: ``(remaining, used, started)`` -> the vendor's answer body.
Shape = Callable[[float, float, float], Any]


@dataclass(frozen=True)
class BalanceRoute:
    """One vendor's balance endpoint: where it is and how its answer looks."""

    provider: str
    path: str
    shape: Shape


def _hunter(remaining: float, used: float, started: float) -> Any:
    return {
        "data": {
            "plan_name": "Provider server",
            "requests": {
                "searches": {"used": used, "available": started},
                "verifications": {"used": 0, "available": 0},
            },
        }
    }


def _findymail(remaining: float, used: float, started: float) -> Any:
    return {"credits": remaining, "verifier_credits": 0}


def _prospeo(remaining: float, used: float, started: float) -> Any:
    return {
        "error": False,
        "response": {"current_plan": "PROVIDER_SERVER", "remaining_credits": remaining,
                     "used_credits": used},
    }  # fmt: skip


def _fullenrich(remaining: float, used: float, started: float) -> Any:
    return {"balance": remaining}


def _generic(remaining: float, used: float, started: float) -> Any:
    return {"credits_remaining": remaining, "credits_used": used}


BALANCE_ROUTES: tuple[BalanceRoute, ...] = (
    BalanceRoute("hunter", "/hunter/v2/account", _hunter),
    BalanceRoute("findymail", "/findymail/api/credits", _findymail),
    BalanceRoute("prospeo", "/prospeo/account-information", _prospeo),
    BalanceRoute("fullenrich", "/fullenrich/api/v1/account/credits", _fullenrich),
    BalanceRoute("fullenrich", "/fullenrich/api/v2/account/credits", _fullenrich),
    *(
        BalanceRoute(name, f"/{name}/v1/account/balance", _generic)
        for name in ("acme", "firmo", "mailfox", "prospectr", "verifly")
    ),
)
