"""`python -m jaxform ...` is the `jaxform` command."""
import sys

from .cli import main

sys.exit(main())
