"""The verifier's side of a sandbox: a uid of its own, the directories only it may use, its environment, its entry.

- verifier_role.py: the verifier's uid, its directories and capabilities, and how it enters.
- verifier_env.py: the verifier's environment: built from system and test dirs only.
- enter_verifier.py: enter a sandbox as its verifier without passing through the agent's uid
  (`python -I -S enter_verifier.py ...`, run from the host's python).
"""
