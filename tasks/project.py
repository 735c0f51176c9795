"""Where the checkout's own folders are: the servers under images/, the built-in data under validation/data."""

from __future__ import annotations

from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
IMAGES_DIR = PROJECT_ROOT / "images"
BUILTIN_DATA_DIR = PROJECT_ROOT / "validation" / "data"
# where `make demo` keeps its state (unless $SHIPLIFT_HOME names one)
DEMO_STATE_DIR = PROJECT_ROOT / ".shiplift" / "demo"
