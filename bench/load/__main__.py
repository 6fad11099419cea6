"""`python -m bench.load`: see bench/load/run.py."""

from bench.load.run import main

raise SystemExit(main())
