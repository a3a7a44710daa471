import subprocess
import sys

import pytest


@pytest.fixture
def cli():
    """Run ``python -m simpar ARGS`` in a fresh process, as a user would; returns CompletedProcess."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "simpar", *args], capture_output=True, text=True,
                              timeout=120)

    return run
