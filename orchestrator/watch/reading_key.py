"""The key that names how logs are read: the parser's version and the user's ``[metrics] patterns`` (pure).

Stored metrics made under another key are stale and read again. Apart from ``logparse`` so that a status, which
compares keys on every read but parses a log only for old runs and for patterns, does not load the reader.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

# Bumped whenever a line may now read differently: stored summaries made by another version are re-read.
PARSER_VERSION = 4


def parser_key(patterns: Mapping[str, str] | None) -> str:
    """Names the way logs are read: the parser's version and the user's patterns. Stored metrics made
    under another key are stale."""
    digest = hashlib.sha256(json.dumps(dict(patterns or {}), sort_keys=True).encode()).hexdigest()[:16]
    return f"{PARSER_VERSION}:{digest}"
