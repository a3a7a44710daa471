"""Work in a forked process beside the caller, talking to it over a pipe: how ``simulate`` prices the two points
of an extrapolation at once on two cores."""

from __future__ import annotations

import multiprocessing

from simpar.errors import SimparError


class Forked:
    """``work(peer)`` in a forked process while the caller goes on, ``peer`` its end of a duplex pipe to the caller
    (``exchange``); ``result()`` waits for what it returned (its exception raised here), ``close()`` stops it if
    it still runs."""

    def __init__(self, work):
        self.peer, theirs = multiprocessing.Pipe()

        def run():
            try:
                result = ("result", work(theirs))
            except BaseException as exc:  # noqa: BLE001 (handed to the caller, which raises it)
                result = ("error", exc)
            theirs.send(result)

        self._process = multiprocessing.get_context("fork").Process(target=run, daemon=True)
        self._process.start()

    def receive(self, kind: str = "result"):
        """The next message ``work`` sent of ``kind`` (its own ``(kind, value)`` tuples, or its result); an
        error it raised is raised here."""
        while not self.peer.poll(0.05):
            if not self._process.is_alive() and not self.peer.poll(0):
                raise SimparError(f"a simulation in a forked process ended without a result "
                                  f"(exit code {self._process.exitcode})")
        got, value = self.peer.recv()
        if got == "error":
            raise value
        if got != kind:
            raise SimparError(f"a simulation in a forked process sent {got} where {kind} was due")
        return value

    def result(self):
        return self.receive("result")

    def close(self) -> None:
        if self._process.is_alive():
            self._process.kill()
        self._process.join()
        self.peer.close()
