"""The run's files that cannot be written now: transcripts, the run log, the eval job database.

A full disk (or an unwritable one) must not stop a run: each writer keeps going without its file
(the run log and a transcript stop writing; the job database holds a finished attempt in memory
and retries, t1/coordinator/evals/eval_jobs.py) and reports here. The first failure of each kind is logged
as an error, its recovery as a warning; `errors()` is what GetRunStatus shows (`write_errors`) and
`t1_write_failing{file}` is 1 meanwhile. The spool degrades on its own terms (t1/coordinator/spool/trajectory_spool.py).
"""

from __future__ import annotations

import logging

from t1.metrics import registry as m

log = logging.getLogger(__name__)


class WriteFaults:
    def __init__(self) -> None:
        self._errors: dict[str, str] = {}

    def failed(self, what: str, error: BaseException) -> None:
        """Writes of `what` fail (the error names the file)."""
        if what not in self._errors:
            log.error("%s cannot be written (%s): the run goes on without it until the disk takes writes again",
                      what, error)
        self._errors[what] = f"{what}: {error}"
        m.WRITE_FAILING.labels(what).set(1)

    def recovered(self, what: str) -> None:
        if self._errors.pop(what, None) is not None:
            log.warning("%s is written again", what)
            m.WRITE_FAILING.labels(what).set(0)

    def errors(self) -> list[str]:
        return list(self._errors.values())
