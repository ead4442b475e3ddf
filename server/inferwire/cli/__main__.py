"""`python -m inferwire.cli`: the same as the `inferwire` command."""

from inferwire.cli import main

main()
