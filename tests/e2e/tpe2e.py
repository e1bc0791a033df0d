"""Helpers shared by the end-to-end tests: where the CLI and the shared data
are, and running the CLI with a clear failure message."""

import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def find_bin():
    b = os.environ.get("TENSORPAR_BIN")
    if b:
        return b
    for cand in ("build/tensorpar", "build-ref/tensorpar"):
        p = os.path.join(ROOT, cand)
        if os.path.exists(p):
            return p
    raise RuntimeError("tensorpar CLI not found: set TENSORPAR_BIN")


def shared_dir():
    return os.environ.get("TENSORPAR_SHARED") or os.path.join(ROOT, "..", "shared")


BIN = find_bin()


def run(*args, input=None, check=True, timeout=300):
    """Runs `tensorpar ARGS`; returns the CompletedProcess (text mode)."""
    p = subprocess.run([BIN, *map(str, args)], input=input, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"tensorpar {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr}")
    return p
