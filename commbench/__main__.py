"""`python -m commbench ...` (also what torchrun's `-m commbench` runs)."""
import sys

from commbench.cli import main

sys.exit(main())
