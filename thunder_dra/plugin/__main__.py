"""``python -m thunder_dra.plugin`` / ``thunder-daemon``: the node daemon's entry point.

Exit status: 0 after a clean shutdown (SIGTERM), 1 when the daemon cannot start (the
reason is the last line on stderr, prefixed ``thunder-daemon:``), 2 for bad flags.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import uvloop

from thunder_dra.plugin.config import ConfigError, parse_config, warn_bare_seconds
from thunder_dra.plugin.daemon import Daemon, StartupError
from thunder_dra.plugin.node.facts import NodeSetupError
from thunder_dra.plugin.state.crashpoints import CrashPoints
from thunder_dra.process.logs import configure_logging

log = logging.getLogger("thunder_dra.plugin")


def main(argv: Sequence[str] | None = None, *, crash: CrashPoints | None = None) -> int:
    """Run the daemon; `crash` is for the test-only entry point (hack.daemon_under_test)."""
    try:
        config = parse_config(argv, os.environ)
    except ConfigError as err:
        print(f"thunder-daemon: {err}", file=sys.stderr)
        return 1
    scrubber = configure_logging(config.log_level, config.log_format)
    scrubber.add(config.api_token)
    warn_bare_seconds(config, log)
    try:
        # libuv's loop: each kubelet call, Thunder and Kubernetes request and worker-thread
        # hand-off costs less of the loop's own CPU than asyncio's pure-Python loop.
        uvloop.run(Daemon(config, scrubber, crash).run())
    except (NodeSetupError, StartupError, ValueError) as err:
        log.error("daemon cannot start", extra={"error": str(err)})
        print(f"thunder-daemon: {scrubber.scrub(str(err))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
