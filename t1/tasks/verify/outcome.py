"""Which failures are the attempt's own and which are T1's: the rule that decides infra_error, as a pure function.

Infra errors are kept out of resolve rate, mean reward, pass@k and training, so a policy that
could turn its failures into infra errors would launder them. The rule:
- infra error: the infrastructure outside the sandbox failed: the provider could not create the
  sandbox, the sandbox or its transport failed before the agent acted, inference failed past its
  retries, or the task needs what the provider cannot give (an image);
- the attempt's failure (reward 0, counted everywhere, its own failure mode): anything that
  goes wrong once the agent has acted and is not positively T1's fault: a verifier it broke, a
  file transfer its full sandbox refused, a sandbox it killed, filled or exhausted, a connection
  that died with it.
Positively T1's (`T1_FAULTS`): the provider, the task's needs, inference past its retries, and
bugs in T1's own code (a TypeError, KeyError, ...): infra errors, logged loudly, never scored.
"""

from __future__ import annotations

from t1.errors import InfraError
from t1.sandbox.needs import NeedsError
from t1.sandbox.ssh.remote import SandboxCreateError
from t1.sandbox.types import SandboxHostLost, SandboxLost
from t1.tasks.transfer import SetupError
from t1.tasks.verify.report import FailureMode

LIMIT_HINTS = ("no space left on device", "disk quota exceeded", "resource temporarily unavailable",
               "cannot allocate memory", "fork: retry", "too many open files", "out of memory")
"""Text of errors that mean the sandbox ran out of processes, memory or disk."""


class T1Fault(InfraError):
    """An error that is positively not the attempt's, even after it acted: T1's or its services' (inference past
    its retries), or the task's (a separate verifier environment that does not build)."""


T1_FAULTS = (
    T1Fault,
    SandboxCreateError,
    SandboxHostLost,
    NeedsError,
    TypeError,
    AttributeError,
    NameError,
    LookupError,
    AssertionError,
    NotImplementedError,
    ImportError,
)
"""What is not the attempt's fault even after it acted: the provider, the task (its needs, its verifier's
environment), inference, and bugs in T1's code."""
SANDBOX_FAULTS = (SandboxLost, SetupError, OSError, TimeoutError)
"""What can fail inside (or on the way into) the sandbox; whose fault it is depends on whether the agent acted."""


def attempt_failure(exc: BaseException, agent_acted: bool) -> FailureMode | None:
    """The failure mode an attempt is scored 0 with for `exc`, or None when `exc` is an infra error (pure).

    Once the agent has acted, anything not positively T1's fault (`T1_FAULTS`) is the attempt's: a file
    transfer the full sandbox refused (SFTPFailure), a path the agent put in T1's way, a lost connection.
    """
    if not agent_acted or isinstance(exc, T1_FAULTS) or not isinstance(exc, Exception):
        return None
    text = str(exc).lower()
    if any(hint in text for hint in LIMIT_HINTS):
        return FailureMode.SANDBOX_AT_LIMIT
    if isinstance(exc, (SandboxLost, TimeoutError, ConnectionError)):
        return FailureMode.SANDBOX_DIED
    return FailureMode.AGENT_BROKE_VERIFIER
