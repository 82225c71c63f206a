"""``playline codec-server``: lets the Temporal UI show encrypted payloads in plaintext.

With ``PLAYLINE_CODEC_KEYS`` set, history holds only ciphertext (see
:mod:`playline.codec`). This server implements Temporal's remote codec protocol
(``POST /decode`` and ``POST /encode`` with ``{"payloads": [...]}`` in protobuf
JSON) with the same keys, for a UI started with it::

    playline codec-server --port 8081 &
    temporal server start-dev --ui-codec-endpoint http://127.0.0.1:8081

(or set it in the UI under "Codec Server"). The browser calls it directly, so it
binds loopback by default and answers only the UI's origin (CORS). It holds the
keys: run it where the people allowed to read the data are, never beside the
server that must not.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from playline.cli.render import console
from playline.codec import AesGcmCodec, CodecError
from playline.config import Settings
from playline.errors import PlaylineError

__all__ = ["add_codec_server_parser", "cmd_codec_server", "codec_app"]

DEFAULT_PORT = 8081
DEFAULT_UI_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")


def codec_app(codec: PayloadCodec, *, ui_origins: Sequence[str] = DEFAULT_UI_ORIGINS) -> Starlette:
    """The remote codec endpoints around ``codec``, answering the browser at ``ui_origins``."""

    async def handle(request: Request, decode: bool) -> JSONResponse:
        try:
            payloads = ParseDict(await request.json(), Payloads())
        except (ParseError, ValueError) as err:
            return JSONResponse({"error": f"expected {{'payloads': [...]}}: {err}"}, 400)
        try:
            done = await (codec.decode if decode else codec.encode)(payloads.payloads)
        except CodecError as err:
            return JSONResponse({"error": str(err)}, 400)
        return JSONResponse(MessageToDict(Payloads(payloads=done)))

    async def decode(request: Request) -> JSONResponse:
        return await handle(request, decode=True)

    async def encode(request: Request) -> JSONResponse:
        return await handle(request, decode=False)

    return Starlette(
        routes=[
            Route("/decode", decode, methods=["POST"]),
            Route("/encode", encode, methods=["POST"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(ui_origins),
                allow_methods=["POST"],
                allow_headers=["content-type", "x-namespace", "authorization"],
                allow_credentials=True,
            )
        ],
    )


def add_codec_server_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    server = sub.add_parser(
        "codec-server",
        help="decode encrypted payloads for the Temporal UI ($PLAYLINE_CODEC_KEYS)",
        description="Serve Temporal's remote codec endpoints (/decode, /encode) with the keys "
        "in $PLAYLINE_CODEC_KEYS, for a UI started with --ui-codec-endpoint.",
    )
    server.add_argument("--host", default="127.0.0.1", help="bind address (default loopback)")
    server.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    server.add_argument(
        "--ui-origin",
        action="append",
        help="the Temporal UI's origin allowed to call it (repeatable; default "
        "http://localhost:8233 and http://127.0.0.1:8233)",
    )


async def cmd_codec_server(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.codec_keys:
        raise PlaylineError(
            "PLAYLINE_CODEC_KEYS is not set; the codec server needs the keys the workers use"
        )
    codec = AesGcmCodec.from_spec(settings.codec_keys)
    origins = args.ui_origin or list(DEFAULT_UI_ORIGINS)
    config = uvicorn.Config(
        codec_app(codec, ui_origins=origins),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )
    endpoint = f"http://{args.host}:{args.port}"
    console.print(
        f"codec server on {endpoint} (keys {', '.join(codec.key_ids)}; UI origins "
        f"{', '.join(origins)}); start the UI with --ui-codec-endpoint {endpoint}"
    )
    await uvicorn.Server(config).serve()
    return 0
