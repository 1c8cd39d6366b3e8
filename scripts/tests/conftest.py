"""pytest set-up for scripts/tests: the modules under test are scripts, not a package; their
directories go on the import path (scripts/lib first, as when a script runs them)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for d in (ROOT / "tests" / "interop", ROOT / "scripts", ROOT / "scripts" / "lib"):
    sys.path.insert(0, str(d))
