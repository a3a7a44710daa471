"""One exception type for every problem a user can fix by changing their input.

The CLI turns it into a single line on stderr and exit code 2; library users can catch it.
"""


class SimparError(ValueError):
    """Bad input: unknown preset, impossible layout, malformed number, and so on.

    The message names the offending field (e.g. ``--gpus``) so the user knows what to change.
    """


class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived (a scheduler, ``timeout``, a closed terminal): unwinds like Ctrl-C,
    so every ``finally`` runs (real runs kill their rank processes) before the CLI exits 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
