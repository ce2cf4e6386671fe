"""Replace one `## ` section of docs/benchmarks.md, leaving every other section as it is;
and the command line and the machine a section quotes."""

from __future__ import annotations

import argparse
import os
import platform
import re
from collections.abc import Sequence
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
"""The one document every benchmark writes its section of."""
INTRO = "# Benchmarks\n\nFigures from the benchmarks in `bench/`, measured on the local platform.\n"
"""How the document starts when the first benchmark to run creates it."""


def command_line(prog: str, args: argparse.Namespace, options: Sequence[str]) -> str:
    """`python -m <prog> --<option> <value> ...` for the named options, as the run used."""
    given = " ".join(f"--{name.replace('_', '-')} {getattr(args, name)}" for name in options)
    return f"python -m {prog} {given}"


def machine() -> str:
    """CPUs, memory, kernel and Python of this machine, as a section names them."""
    cpus = os.cpu_count() or 0
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    memory = ""
    try:
        kib = int(re.findall(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[0])
        memory = f", {kib / 1024 / 1024:.0f} GiB RAM"
    except (OSError, IndexError):
        memory = ""
    system = f"Linux {platform.release()}, Python {platform.python_version()}"
    return f"{cpus} CPUs ({model}){memory}, {system}"


def replace_section(
    path: Path, heading: str, text: str, *, intro: str, after: str | None = None
) -> None:
    """Write `text` (which starts with `heading`) as that section of `path`.

    An existing section is replaced up to the next `## ` heading. A missing one goes right
    after the section `after` when given and present, else at the end. A missing file starts
    from `intro`.
    """
    section = text.rstrip("\n") + "\n"
    current = path.read_text() if path.exists() else intro
    start = current.find(f"\n{heading}\n")
    if start != -1:
        following = current.find("\n## ", start + 1)
        rest = "" if following == -1 else current[following:]
        updated = current[: start + 1] + section + rest
    else:
        anchor = -1 if after is None else current.find(f"\n{after}\n")
        following = -1 if anchor == -1 else current.find("\n## ", anchor + 1)
        if following == -1:
            updated = current.rstrip("\n") + "\n\n" + section
        else:
            updated = current[: following + 1] + section + "\n" + current[following + 1 :]
    path.write_text(updated.rstrip("\n") + "\n")
