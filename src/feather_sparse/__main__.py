"""``python -m feather_sparse`` runs the command-line tool (also under torchrun)."""

from feather_sparse.cli import main

raise SystemExit(main())
