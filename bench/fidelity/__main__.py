"""`python -m bench.fidelity`: see bench/fidelity/cli.py."""

from bench.fidelity.cli import main

raise SystemExit(main())
