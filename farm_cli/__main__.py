"""`python -m farm_cli`: the `farm` command where no `farm` script is on PATH (a service's command line)."""

from farm_cli.main import main

main()
