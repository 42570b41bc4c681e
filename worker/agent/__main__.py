"""`python -m worker.agent` (launchd, `farm services`, tests): the entry is worker/cli.py's `main`.

A module of its own so the agent (worker/agent/__init__.py) never imports its command line, which builds it.
"""

from worker.cli import main

raise SystemExit(main())
