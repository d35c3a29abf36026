"""`python -m ampscope_server.cli`: the `ampscope` command."""

from ampscope_server.cli.main import main

raise SystemExit(main())
