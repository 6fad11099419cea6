"""Which failures are the attempt's own and which are T1's: the rule that decides infra_error, as a pure function.

Infra errors are kept out of resolve rate, mean reward, pass@k and training, so a policy that
could turn its failures into infra errors would launder them. The rule:
- infra error: the infrastructure outside the sandbox failed: the provider could not create the
  sandbox, the sandbox or its transport failed before the agent acted, inference failed past its
  retries, or the task needs what the provider cannot give (an image);
- the attempt's failure (reward 0, counted everywhere, its own failure mode): anything that
  goes wrong inside the sandbox once the agent has acted: a verifier it broke, a sandbox it
  killed, filled or exhausted, a connection that died with it.
Bugs in T1 (any other exception) stay infra errors, logged loudly, never scored.
"""

from __future__ import annotations

from t1.sandbox.remote import SandboxCreateError
from t1.sandbox.types import SandboxLost
from t1.tasks.needs import NeedsError
from t1.tasks.report import FailureMode
from t1.tasks.transfer import SetupError

LIMIT_HINTS = ("no space left on device", "disk quota exceeded", "resource temporarily unavailable",
               "cannot allocate memory", "fork: retry", "too many open files", "out of memory")
"""Text of errors that mean the sandbox ran out of processes, memory or disk."""

SANDBOX_FAULTS = (SandboxLost, SetupError, OSError, TimeoutError)
"""What can fail inside (or on the way into) the sandbox; whose fault it is depends on whether the agent acted."""


def attempt_failure(exc: BaseException, agent_acted: bool) -> FailureMode | None:
    """The failure mode an attempt is scored 0 with for `exc`, or None when `exc` is an infra error (pure)."""
    if isinstance(exc, (SandboxCreateError, NeedsError)) or not agent_acted:
        return None
    if not isinstance(exc, SANDBOX_FAULTS):
        return None  # inference past retries, or a bug: never the policy's doing
    text = str(exc).lower()
    if any(hint in text for hint in LIMIT_HINTS):
        return FailureMode.SANDBOX_AT_LIMIT
    if isinstance(exc, SetupError):
        return FailureMode.AGENT_BROKE_VERIFIER
    return FailureMode.SANDBOX_DIED
