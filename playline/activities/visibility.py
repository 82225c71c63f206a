"""Which of playline's search attributes the namespace has registered (a local activity).

Temporal fails a workflow task that upserts an unregistered search attribute, and
retries it for ever, so a play asks this once at its start and upserts only what
is registered. A local activity, so the answer is recorded and a replay takes it
from history. A namespace that has them all is remembered for the worker's
lifetime (attributes are not unregistered under running plays); one that lacks
some is asked again by the next play, so ``playline setup`` takes effect at once.
"""

from __future__ import annotations

import logging

from temporalio import activity
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.service import RPCError

from playline.search_attributes import ALL_KEYS

logger = logging.getLogger("playline.visibility")


class VisibilityActivities:
    """Asks the namespace about playline's search attributes."""

    def __init__(self) -> None:
        self._complete: set[str] = set()  # namespaces known to have every key

    @activity.defn(name="playline.registered_search_attributes")
    async def registered_search_attributes(self) -> list[str]:
        """The names of playline's search attributes registered with the right type."""
        namespace = activity.info().namespace
        wanted = [key.name for key in ALL_KEYS]
        if namespace in self._complete:
            return wanted
        try:
            listed = await activity.client().operator_service.list_search_attributes(
                ListSearchAttributesRequest(namespace=namespace)
            )
        except RPCError as err:
            logger.warning(
                "cannot list the search attributes of namespace %s (%s); plays run without "
                "them (register them with `playline setup`)",
                namespace,
                err.message,
            )
            return []
        custom = dict(listed.custom_attributes)
        found = [
            key.name for key in ALL_KEYS if custom.get(key.name) == int(key.indexed_value_type)
        ]
        if found == wanted:
            self._complete.add(namespace)
        else:
            missing = sorted(set(wanted) - set(found))
            logger.warning(
                "namespace %s lacks playline's search attributes %s; register them with "
                "`playline setup`",
                namespace,
                ", ".join(missing),
            )
        return found
