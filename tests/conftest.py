import os
import subprocess
import sys

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_hardware_cache(tmp_path_factory):
    """Tests never read or write this machine's cached hardware profiles (simpar calibrate)."""
    os.environ["SIMPAR_CACHE"] = str(tmp_path_factory.mktemp("simpar-cache"))


@pytest.fixture
def cli():
    """Run ``python -m simpar ARGS`` in a fresh process, as a user would; returns CompletedProcess."""

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "simpar", *args], capture_output=True, text=True,
                              timeout=120)

    return run
