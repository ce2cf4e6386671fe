# The operator with test overrides: `thunder-operator` plus `--orphan-grace-period-override
# DURATION`, which replaces spec.operator.orphanGracePeriod (its validated minimum, 30s,
# would make reaper tests slow). Tests only: images ship thunder_dra alone, so a
# production operator can never be started this way.
#
#   .venv/bin/python -m hack.operator_under_test [--orphan-grace-period-override 4s] <flags>
"""Start the operator with test overrides (tests only)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence

from thunder_dra.api.duration import parse_duration
from thunder_dra.controllers.__main__ import main
from thunder_dra.controllers.process.options import OperatorOptions, parse_options


def parse(argv: Sequence[str]) -> OperatorOptions:
    """The operator's options from `argv`, with the test overrides applied."""
    overrides = argparse.ArgumentParser(add_help=False)
    overrides.add_argument("--orphan-grace-period-override", default=None)
    known, rest = overrides.parse_known_args(list(argv))
    options = parse_options(rest)
    if known.orphan_grace_period_override is None:
        return options
    grace = parse_duration(known.orphan_grace_period_override)
    return dataclasses.replace(options, orphan_grace_period_override=grace)


if __name__ == "__main__":
    main(options=parse(sys.argv[1:]))
