"""Run the fake Thunder service (and its artifact host under /artifacts/) as a process.

    python -m hack.fake_thunder --listen 127.0.0.1:0 [--token T ...] [--seed state.json]

Prints its base URL as the first stdout line, logs to stderr, serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

from hack.fake_thunder.server import start_server
from hack.fake_thunder.service import FakeThunder


def _split_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return host.strip("[]") or "127.0.0.1", int(port)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hack.fake_thunder", description=__doc__)
    parser.add_argument("--listen", type=_split_listen, default=("127.0.0.1", 0))
    parser.add_argument(
        "--token", action="append", default=[], help="an API token with every capability"
    )
    parser.add_argument("--seed", type=Path, help="initial state, in the /_admin/state format")
    parser.add_argument("--log-level", default="WARNING")
    parser.add_argument("--tls-cert", type=Path, help="serve https with this certificate (PEM)")
    parser.add_argument("--tls-key", type=Path, help="the certificate's key (PEM)")
    return parser.parse_args(argv)


async def _serve(args: argparse.Namespace) -> None:
    seed = json.loads(args.seed.read_text()) if args.seed else None
    service = FakeThunder(api_tokens=args.token, seed=seed)
    host, port = args.listen
    tls = (args.tls_cert, args.tls_key) if args.tls_cert and args.tls_key else None
    server = await start_server(service, host, port, tls=tls)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(server.base_url, flush=True)
    logging.getLogger("hack.fake_thunder").info("listening on %s", server.base_url)
    try:
        await stop.wait()
    finally:
        await server.stop()


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s"
    )
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
