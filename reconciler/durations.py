"""The one duration syntax of the settings (`15`, `15s`, `500ms`, `2m`, `1h`), for settings.py and the blocks it
holds (alerting/config.py)."""

from __future__ import annotations

import re

_DURATION = re.compile(r"[ \t]*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)[ \t]*(ms|s|m|h)?[ \t]*")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(value: object) -> object:
    """Accept 15, 15.0, "15", "15s", "500ms", "2m", "1h"; leave anything else for pydantic to reject."""
    if isinstance(value, str):
        m = _DURATION.fullmatch(value)
        if not m:
            raise ValueError(f"not a duration: {value!r} (examples: 15, 15s, 500ms, 2m, 1h)")
        return float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
    return value
