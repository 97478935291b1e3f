"""``python -m llmrs_core.cli`` is the ``llmrs`` CLI (as ``python -m llmrs_core`` is)."""

import sys

from . import main

sys.exit(main())
