"""``playline catalog reference``: every key of a provider catalog, as Markdown.

Written from the catalog's models by :mod:`playline.calls.catalog_reference`; the
repository keeps its output in ``docs/catalog.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from playline.config import Settings


def add_catalog_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    catalog = sub.add_parser("catalog", help="the provider catalog's reference")
    catalog_sub = catalog.add_subparsers(dest="catalog_command", required=True)
    reference = catalog_sub.add_parser(
        "reference", help="every key of a catalog TOML file: type, default, meaning (Markdown)"
    )
    reference.add_argument("--out", help="write it to this file instead of standard output")


async def cmd_catalog(args: argparse.Namespace, settings: Settings) -> int:
    from playline.calls.catalog_reference import render

    text = render()
    if args.out:
        await asyncio.to_thread(Path(args.out).write_text, text)
    else:
        sys.stdout.write(text)
    return 0
