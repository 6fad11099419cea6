"""What will stop a task on this host (the needs_* reasons of t1/sandbox/needs.py), predicted from its folder.

- predict.py: static_needs (what provision refuses before touching a sandbox) and package_needs.
- installers.py: installer commands found in shell text (bashlex), checked against this host.
- test_imports.py: packages the task's Python tests import that neither host nor task provides; test files
  the sandbox's python3 cannot compile.
- validate.py: `t1 tasks validate`: ok, will_not_run, incomplete or malformed, with what was found.
"""
