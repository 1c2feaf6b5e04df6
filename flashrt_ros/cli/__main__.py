"""``python -m flashrt_ros.cli``: the ``flashrt`` command."""
import sys

from flashrt_ros.cli import main

sys.exit(main())
