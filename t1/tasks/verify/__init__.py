"""After the agent: a task's verifiers run, their report read and bounded, the reward and whose fault a failure is.

- verifier.py: run the tests after the agent (or every K turns with cleanup=True for process rewards).
- separate.py: Harbor's separate verifier environment: a fresh sandbox fed only the declared artifacts.
- report.py: VerifierReport (with a FailureMode saying why) and its parsers: pytest -rA, CTRF, JUnit, reward files.
- declared.py: the tests a task declares, counted from its files on the host; a report they cannot give is
  tampered.
- rewards.py: count / fraction / binary rewards, multi-step combination, process rewards (pure).
- outcome.py: whose fault a failure is (the infra_error rule, pure).
- oracle.py: run reference solutions (oracle) or nothing (verify) in fresh sandboxes.
"""
