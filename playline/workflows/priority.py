"""Temporal's own priority and fairness for a play: the same key, weight and class the
governor uses for provider calls (``RunOptions.fairness_key|fairness_weight|priority``).

A play's fairness key decides two queues: which of the waiting provider calls the
governor sends next (weighted fair queuing per key) and which of the backlogged
tasks Temporal's matching service hands to a worker next
(:class:`temporalio.common.Priority`). Were they keyed differently, a key could win
the worker slots and lose the provider, or the reverse; so every start of a play,
of its dataset runs and of its chunk, scalar and estimate activities carries the
``Priority`` built here from the run's options.

``RunOptions.fairness_key`` ``None`` means "the play run itself": the play fills it
in with its own workflow id (:func:`play_fairness_key`) before anything inherits
its options, and a client starting a play passes the workflow id it chose as
``default_key``, so both sides name the same key.

Replay: a command's priority is not part of Temporal's determinism check (an
activity is matched by its type and id, a child workflow by its type and id), so
histories recorded before priorities were set replay as they are (the recorded
histories in ``tests/histories`` do): no ``workflow.patched`` guard is needed.

Pure functions of their arguments (``hashlib`` only): safe in the workflow sandbox
and on replay. Servers without fairness (``matching.enableFairness`` off, older
servers) ignore the fairness fields and still order by ``priority_key``.
"""

from __future__ import annotations

import hashlib
import re

from temporalio.common import Priority

from playline.contract import RunOptions

__all__ = [
    "MAX_TEMPORAL_FAIRNESS_KEY_BYTES",
    "play_fairness_key",
    "temporal_fairness_key",
    "temporal_priority",
]

#: Temporal refuses a longer ``Priority.fairness_key`` ("fairness key length exceeds
#: limit"), while ``RunOptions.fairness_key`` allows 128 characters.
MAX_TEMPORAL_FAIRNESS_KEY_BYTES = 64
#: What ``RunOptions.fairness_key`` accepts (its pattern, kept in step with contract.py).
_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_.:@/-]{1,128}$")
_NOT_KEY_CHARS = re.compile(r"[^A-Za-z0-9_.:@/-]")
_MAX_KEY_CHARS = 128
#: Hex digits of the digest that keeps a shortened or rewritten key unique.
_DIGEST_CHARS = 16


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_CHARS]


def play_fairness_key(workflow_id: str) -> str:
    """The ``RunOptions.fairness_key`` naming the play run ``workflow_id``.

    The id itself when ``RunOptions`` accepts it (the ids playline chooses always
    are). Any workflow id may be given (``playline run --id 'a b'``), yet every dataset
    run and chunk decodes the play's options again, pattern included: an id with other
    characters, or longer than 128, becomes a valid key with a digest of the id, so
    it still names that run alone and its children do not fail to decode.
    """
    if _KEY_PATTERN.match(workflow_id):
        return workflow_id
    cleaned = _NOT_KEY_CHARS.sub("_", workflow_id)
    return f"{cleaned[: _MAX_KEY_CHARS - _DIGEST_CHARS - 1]}-{_digest(workflow_id)}"


def temporal_fairness_key(key: str) -> str:
    """``key`` as Temporal accepts it: itself up to 64 bytes, else a 64-byte prefix-and-
    digest (deterministic, so the play, its children and a client agree)."""
    if len(key.encode()) <= MAX_TEMPORAL_FAIRNESS_KEY_BYTES:
        return key
    keep = MAX_TEMPORAL_FAIRNESS_KEY_BYTES - _DIGEST_CHARS - 1
    prefix = key.encode()[:keep].decode(errors="ignore")
    return f"{prefix}-{_digest(key)}"


def temporal_priority(options: RunOptions, default_key: str) -> Priority:
    """Temporal's ``Priority`` for work of a run with ``options``.

    Args:
        options: the run's options: its fairness key, weight and priority class.
        default_key: the key when ``options.fairness_key`` is ``None`` (the run's own
            workflow id: the play, or the client that starts it, passes it).

    The priority class maps onto ``priority_key`` as it is (1 first .. 5 last, the
    server's default range); the weight onto ``fairness_weight``.
    """
    key = options.fairness_key or play_fairness_key(default_key)
    return Priority(
        priority_key=options.priority,
        fairness_key=temporal_fairness_key(key),
        fairness_weight=options.fairness_weight,
    )
