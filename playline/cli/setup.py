"""``playline setup``: register playline's search attributes in a namespace.

A play upserts ``PlaylinePlay``, ``PlaylineStatus``, ``PlaylineRowsTotal``,
``PlaylineRowsDone``, ``PlaylineRowsFailed`` and ``PlaylineCredits`` only where they
are registered (see :mod:`playline.search_attributes`). ``playline dev`` and
``playline demo`` register them on their embedded server; on a cluster, run
``playline setup`` once per namespace (it adds what is missing and changes nothing
else), or ``playline setup --print`` for the equivalent ``temporal`` commands (for
Temporal Cloud, whose namespaces are managed with ``tcld`` or the Cloud UI, create
the same names and types there).
"""

from __future__ import annotations

import argparse
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from playline.cli.render import out
from playline.config import Settings
from playline.errors import PlaylineError
from playline.search_attributes import ALL_KEYS, type_name
from playline.worker import connect


def add_setup_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: Any) -> None:
    setup = sub.add_parser("setup", help="register playline's search attributes in a namespace")
    common(setup)
    setup.add_argument(
        "--print",
        dest="print_only",
        action="store_true",
        help="print the `temporal operator search-attribute create` commands instead",
    )


def create_commands(namespace: str) -> list[str]:
    """The ``temporal`` commands that register every key in ``namespace``."""
    return [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type {type_name(key)}"
        for key in ALL_KEYS
    ]


async def registered_search_attributes(client: Client) -> list[str]:
    """playline's keys registered in the client's namespace with the right type."""
    try:
        listed = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except RPCError:
        return []
    custom = dict(listed.custom_attributes)
    return [key.name for key in ALL_KEYS if custom.get(key.name) == int(key.indexed_value_type)]


async def register(client: Client) -> list[str]:
    """Register the keys the namespace lacks; the names added. A name registered with
    another type is an error (rename or remove it first)."""
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    custom = dict(listed.custom_attributes)
    clashing = [
        f"{key.name} (registered with another type, wanted {type_name(key)})"
        for key in ALL_KEYS
        if key.name in custom and custom[key.name] != int(key.indexed_value_type)
    ]
    if clashing:
        raise PlaylineError(
            f"namespace {client.namespace} has {', '.join(clashing)}; remove it and run "
            "`playline setup` again"
        )
    missing = {
        key.name: IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{key.indexed_value_type.name}")
        for key in ALL_KEYS
        if key.name not in custom
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return list(missing)


async def cmd_setup(args: argparse.Namespace, settings: Settings) -> int:
    if args.print_only:
        for line in create_commands(settings.temporal_namespace):
            out().print(line, highlight=False)
        return 0
    client = await connect(settings=settings)
    try:
        added = await register(client)
    except RPCError as err:
        raise PlaylineError(
            f"cannot register search attributes in namespace {settings.temporal_namespace}: "
            f"{err.message} (on Temporal Cloud, create them as `playline setup --print` lists)"
        ) from None
    names = ", ".join(f"{k.name} ({type_name(k)})" for k in ALL_KEYS)
    if added:
        out().print(f"registered {', '.join(added)} in namespace {settings.temporal_namespace}")
    else:
        out().print(f"namespace {settings.temporal_namespace} already has {names}")
    return 0
