"""What an installed gputop carries besides its code: recordings of real sessions on an H200
(`gputop demo --replay`: the GPU panels on a machine without a GPU), and where its docs are.

The recordings are package data (pyproject.toml, ``[tool.setuptools.package-data]``), copies of
tests/data/h200/*.gtrec: ``pip install .`` and ``pipx install .`` install them."""

from __future__ import annotations

import json
import os

RECORDINGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recordings")
DEFAULT_RECORDING = "gpu_bound"
DISTRIBUTION = "gputop-triage"

# One line each for `gputop demo --list`; a file without a line is still listed.
ABOUT = {
    "gpu_bound": "an H200 kept busy by large matmuls: 30 s of every GPU counter, GPU busy 100%",
    "input_bound": "an H200 starved by a slow DataLoader: 2 workers at 100% CPU (the README's screenshot)",
}


class RecordingNotFound(Exception):
    """No bundled recording of that name: the message names the ones there are."""


def recordings() -> dict[str, str]:
    """{name: path} of the bundled recordings, sorted by name."""
    try:
        names = sorted(n for n in os.listdir(RECORDINGS_DIR) if n.endswith(".gtrec"))
    except OSError:
        names = []
    return {n[: -len(".gtrec")]: os.path.join(RECORDINGS_DIR, n) for n in names}


def find_recording(name: str | None = None) -> str:
    """The path of the bundled recording ``name`` (default: DEFAULT_RECORDING)."""
    have = recordings()
    name = DEFAULT_RECORDING if name is None else name.removesuffix(".gtrec")
    if name in have:
        return have[name]
    if not have:
        raise RecordingNotFound(f"this install has no bundled recordings (expected them in {RECORDINGS_DIR})")
    raise RecordingNotFound(f"no bundled recording {name!r}: choose one of {', '.join(have)} (gputop demo --list)")


def list_text() -> str:
    """The recordings for `gputop demo --list`."""
    lines = ["", "recordings of real sessions on an H200 (gputop demo --replay NAME):"]
    lines += [f"{name:<22} {ABOUT.get(name, '')}".rstrip() for name in recordings()]
    return "\n".join(lines) + "\n"


def _source_tree_of_install() -> str | None:
    """The directory ``pip install DIR`` installed from (PEP 610's direct_url.json), if local."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution(DISTRIBUTION).read_text("direct_url.json")
    except (ImportError, PackageNotFoundError, OSError):
        return None
    try:
        url = json.loads(text or "null")["url"]
    except (ValueError, TypeError, KeyError):
        return None
    return url[len("file://"):] if isinstance(url, str) and url.startswith("file://") else None


def docs_dir() -> str | None:
    """Where gputop's docs (docs/*.md) are on this machine: the checkout gputop runs from, else
    the clone it was installed from; None when neither is there (installed from an archive, or the
    clone was removed). gputop has no public web site, so help cannot give a URL."""
    package = os.path.dirname(os.path.dirname(RECORDINGS_DIR))  # .../gputop
    tree = _source_tree_of_install()
    for d in (os.path.join(os.path.dirname(package), "docs"), tree and os.path.join(tree, "docs")):
        if d and os.path.isfile(os.path.join(d, "metrics.md")):
            return d
    return None
