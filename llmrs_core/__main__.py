"""``python -m llmrs_core`` is the ``llmrs`` CLI."""

import sys

from .cli import main

sys.exit(main())
