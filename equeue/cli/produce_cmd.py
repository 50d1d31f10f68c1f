"""``equeue produce``."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Placeholder registration (filled in by the produce command implementation)."""
