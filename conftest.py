# Test-only environment defaults, set before Django's settings are imported.
from __future__ import annotations

import os

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret")
os.environ.setdefault("TERRET_TESTING", "1")
