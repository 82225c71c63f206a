"""Credits in the user's currency: a provider's ``credit_price`` (catalog or preset)
turns its credits into money.

Credits stay the unit of every budget and ledger (they are what providers count);
money is a view, computed where the credits are shown. The workers know the catalog,
so they send the prices of the providers a run used along with its figures
(``ChunkStats.prices``: a few numbers per provider, never a row); clients, which need
not have the catalog, render them with :func:`money_text`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["amount_text", "money_text", "prices_of"]


def prices_of(catalog: Any, providers: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{provider: {"credit_price", "currency"}}`` for those of ``providers`` whose
    catalog entry states a price (``catalog``: a :class:`~playline.calls.catalog.Catalog`)."""
    found: dict[str, dict[str, Any]] = {}
    for name in sorted(set(providers)):
        spec = catalog.providers.get(name)
        if spec is not None and spec.credit_price is not None:
            found[name] = {"credit_price": spec.credit_price, "currency": spec.currency}
    return found


def money_text(
    credits_by_provider: Mapping[str, float], prices: Mapping[str, Mapping[str, Any]]
) -> str | None:
    """``≈ 12.34 USD`` for the credits of the priced providers (one amount per currency),
    naming providers with credits but no price; ``None`` when none is priced."""
    amounts: dict[str, float] = {}
    unpriced: list[str] = []
    for provider, credits in sorted(credits_by_provider.items()):
        price = prices.get(provider)
        if price is None:
            if credits:
                unpriced.append(provider)
            continue
        currency = str(price.get("currency") or "USD")
        amounts[currency] = amounts.get(currency, 0.0) + float(credits) * float(
            price["credit_price"]
        )
    if not amounts:
        return None
    shown = " + ".join(f"{amount:,.2f} {currency}" for currency, amount in sorted(amounts.items()))
    rest = f" (no price for {', '.join(unpriced)})" if unpriced else ""
    return f"≈ {shown}{rest}"


def amount_text(amount: float) -> str:
    """An amount of money as a cap and its spend are shown: two decimals (``12.30``),
    more when it has them (``0.048``: a credit price times a few credits), never an
    exponent."""
    text = f"{amount:,.2f}"
    if abs(float(text.replace(",", "")) - amount) < 1e-9:
        return text
    return f"{amount:,.6f}".rstrip("0")
