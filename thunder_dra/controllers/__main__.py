"""`python -m thunder_dra.controllers` / `thunder-operator`: run the operator.

See `thunder-operator --help` and docs/operator.md.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from thunder_dra.controllers.process.options import OperatorOptions, parse_options
from thunder_dra.process.logs import configure_logging


def main(argv: Sequence[str] | None = None, *, options: OperatorOptions | None = None) -> None:
    """Run the operator; `options` replaces parsing (the test-only entry point's way in)."""
    options = options if options is not None else parse_options(argv)
    configure_logging(options.log_level, options.log_format)
    # Imported after logging is set up: kopf and the client log while importing.
    from thunder_dra.controllers.process.main import run_operator

    logging.getLogger(__name__).info(
        "starting the operator",
        extra={
            "namespace": options.namespace,
            "standalone": options.standalone,
            "lease": None if options.standalone else f"{options.namespace}/{options.lease_name}",
            "webhook_port": options.webhook_port or None,
        },
    )
    try:
        asyncio.run(run_operator(options))
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
