"""Helpers for tests that look at what a workflow history holds at rest."""

from __future__ import annotations

from collections.abc import Iterator

from google.protobuf.message import Message
from temporalio.api.common.v1 import Payload
from temporalio.client import WorkflowHistory


def payloads_in(message: Message) -> Iterator[Payload]:
    """Every ``Payload`` anywhere inside a protobuf message (events, failures, memos...)."""
    if isinstance(message, Payload):
        yield message
        return
    for field, value in message.ListFields():
        if field.message_type is None:
            continue
        if field.is_repeated:
            items = value.values() if hasattr(value, "values") else value
            for item in items:
                if isinstance(item, Message):
                    yield from payloads_in(item)
        else:
            yield from payloads_in(value)


def history_payloads(history: WorkflowHistory) -> list[Payload]:
    """The payloads of every event of ``history``, as stored by the server."""
    return [p for event in history.events for p in payloads_in(event)]


def history_text(history: WorkflowHistory) -> str:
    """Every payload's bytes, decoded leniently, one per line: what a reader of history sees."""
    return "\n".join(p.data.decode("utf-8", "replace") for p in history_payloads(history))
