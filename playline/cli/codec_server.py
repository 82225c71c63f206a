"""``playline codec-server``: lets the Temporal UI show encrypted payloads in plaintext.

With ``PLAYLINE_CODEC_KEYS`` set, history holds only ciphertext (see
:mod:`playline.codec`). This server implements Temporal's remote codec protocol
(``POST /decode`` and ``POST /encode`` with ``{"payloads": [...]}`` in protobuf
JSON) with the same keys, for a UI started with it::

    playline codec-server --port 8081 &
    temporal server start-dev --ui-codec-endpoint http://127.0.0.1:8081

(or set it in the UI under "Codec Server"). The browser calls it directly, so it
binds loopback by default and answers only the UI's origin (CORS). CORS alone does
not stop a DNS-rebinding page (a hostile name re-pointed at 127.0.0.1 is the page's
own origin), so requests must also name an allowed host (``Host``: loopback, the
bound host, ``--allowed-host``). With a token (``--token``, ``PLAYLINE_CODEC_TOKEN``)
every request must carry ``Authorization: Bearer <token>``; a server reachable
beyond loopback refuses to start without one (``--insecure-no-token`` overrides).
Bodies are capped (4 MiB). It holds the keys: run it where the people allowed to
read the data are, never beside the server that must not.
"""

from __future__ import annotations

import argparse
import hmac
import json
from collections.abc import Sequence

import uvicorn
from google.protobuf.json_format import MessageToDict, ParseDict, ParseError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.api.common.v1 import Payloads
from temporalio.converter import PayloadCodec

from playline.cli.flags import add_listen_flags
from playline.cli.render import console
from playline.codec import AesGcmCodec, CodecError
from playline.config import Settings
from playline.errors import PlaylineError
from playline.request_body import BodyTooLarge, read_capped_body
from playline.webview.guard import is_loopback

__all__ = [
    "LOOPBACK_HOSTS",
    "MAX_BODY_BYTES",
    "add_codec_server_parser",
    "allowed_hosts",
    "check_exposure",
    "cmd_codec_server",
    "codec_app",
]

DEFAULT_PORT = 8081
DEFAULT_UI_ORIGINS = ("http://localhost:8233", "http://127.0.0.1:8233")
#: The ``Host`` names always answered: this machine's loopback names and addresses.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
#: The largest request body answered (a UI page of payloads is far smaller): 413 beyond.
MAX_BODY_BYTES = 4 * 1024 * 1024


def allowed_hosts(bound: str, extra: Sequence[str] = ()) -> list[str]:
    """The ``Host`` header names to answer: loopback, the bound host and ``extra``.

    IPv6 literals are listed bracketed too, as they appear in a ``Host`` header.
    """
    hosts: list[str] = []
    for name in (*LOOPBACK_HOSTS, bound, *extra):
        name = name.strip().lower()
        if not name:
            continue
        forms = [name]
        if ":" in name and not name.startswith("["):
            forms.append(f"[{name}]")
        hosts += [form for form in forms if form not in hosts]
    return hosts


def check_exposure(host: str, token: str | None, *, insecure_no_token: bool = False) -> None:
    """Refuse to serve the keys beyond loopback without a token (unless told to)."""
    if token or insecure_no_token or is_loopback(host):
        return
    raise PlaylineError(
        f"refusing to serve decryption on {host} without a token: set PLAYLINE_CODEC_TOKEN "
        "(or --token), bind 127.0.0.1, or pass --insecure-no-token"
    )


def codec_app(
    codec: PayloadCodec,
    *,
    ui_origins: Sequence[str] = DEFAULT_UI_ORIGINS,
    hosts: Sequence[str] = LOOPBACK_HOSTS,
    token: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> Starlette:
    """The remote codec endpoints around ``codec``, answering the browser at ``ui_origins``.

    Args:
        codec: the payload codec the workers use.
        ui_origins: origins whose pages may read the answers (CORS).
        hosts: ``Host`` header names answered; any other gets 400 (DNS rebinding).
        token: when set, every request must carry ``Authorization: Bearer <token>``
            (compared in constant time) or gets 401.
        max_body_bytes: larger bodies get 413 without being read further.
    """
    expected = f"Bearer {token}".encode() if token else None

    def authorized(request: Request) -> bool:
        if expected is None:
            return True
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    async def handle(request: Request, decode: bool) -> JSONResponse:
        if not authorized(request):
            return JSONResponse(
                {"error": "this codec server needs Authorization: Bearer <PLAYLINE_CODEC_TOKEN>"},
                401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        try:
            body = await read_capped_body(request, max_body_bytes)
        except BodyTooLarge:
            return JSONResponse({"error": f"the body is over {max_body_bytes} bytes"}, 413)
        try:
            payloads = ParseDict(json.loads(body), Payloads())
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
            # Outermost: a request naming a foreign host is refused before anything else.
            Middleware(TrustedHostMiddleware, allowed_hosts=list(hosts), www_redirect=False),
            Middleware(
                CORSMiddleware,
                allow_origins=list(ui_origins),
                allow_methods=["POST"],
                allow_headers=["content-type", "x-namespace", "authorization"],
                allow_credentials=True,
            ),
        ],
    )


def add_codec_server_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    server = sub.add_parser(
        "codec-server",
        help="decode encrypted payloads for the Temporal UI ($PLAYLINE_CODEC_KEYS)",
        description="Serve Temporal's remote codec endpoints (/decode, /encode) with the keys "
        "in $PLAYLINE_CODEC_KEYS, for a UI started with --ui-codec-endpoint.",
    )
    add_listen_flags(server, DEFAULT_PORT)
    server.add_argument(
        "--ui-origin",
        action="append",
        help="the Temporal UI's origin allowed to call it (repeatable; default "
        "http://localhost:8233 and http://127.0.0.1:8233)",
    )
    server.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="HOST",
        help="another name the server may be reached by (Host header; repeatable); "
        "loopback and the bound host always are",
    )
    server.add_argument(
        "--token",
        help="require 'Authorization: Bearer TOKEN' on every request (default "
        "$PLAYLINE_CODEC_TOKEN, which ps does not show; unset: none)",
    )
    server.add_argument(
        "--insecure-no-token",
        action="store_true",
        help="serve a non-loopback host without a token (anyone who reaches it can decrypt)",
    )


async def cmd_codec_server(args: argparse.Namespace, settings: Settings) -> int:
    if not settings.codec_keys:
        raise PlaylineError(
            "PLAYLINE_CODEC_KEYS is not set; the codec server needs the keys the workers use"
        )
    token = args.token or settings.codec_token
    check_exposure(args.host, token, insecure_no_token=args.insecure_no_token)
    codec = AesGcmCodec.from_spec(settings.codec_keys)
    origins = args.ui_origin or list(DEFAULT_UI_ORIGINS)
    hosts = allowed_hosts(args.host, args.allowed_host)
    config = uvicorn.Config(
        codec_app(codec, ui_origins=origins, hosts=hosts, token=token),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )
    endpoint = f"http://{args.host}:{args.port}"
    console.print(
        f"codec server on {endpoint} (keys {', '.join(codec.key_ids)}; UI origins "
        f"{', '.join(origins)}; hosts {', '.join(hosts)}; "
        f"{'bearer token required' if token else 'no token'}); start the UI with "
        f"--ui-codec-endpoint {endpoint}"
    )
    await uvicorn.Server(config).serve()
    return 0
