"""Local offset storage for broadcast mode: one JSON file per group.

In broadcast mode every member reads every queue, so offsets belong to the member,
not the group, and live on its disk: ``<state_dir>/<group>.offsets.json`` holding
``{"topic": {"queue_id": offset}}``. Writes are atomic (temp file, fsync, rename,
fsync of the directory), so a crash leaves either the old or the new file.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from equeue.errors import ConfigError

log = logging.getLogger("equeue.consumer")

__all__ = ["BroadcastOffsetStore", "default_state_dir"]


def default_state_dir() -> Path:
    """``$EQUEUE_STATE_DIR`` or ``~/.equeue/state``."""
    env = os.environ.get("EQUEUE_STATE_DIR")
    return Path(env) if env else Path.home() / ".equeue" / "state"


class BroadcastOffsetStore:
    """Offsets of one broadcast consumer, kept in memory and saved atomically."""

    def __init__(self, state_dir: Path, group: str) -> None:
        self.path = Path(state_dir) / f"{group}.offsets.json"
        self.offsets: dict[tuple[str, int], int] = {}

    def load(self) -> None:
        """Read the file if it exists. Raises ConfigError if it is not valid JSON offsets."""
        try:
            raw = json.loads(self.path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read broadcast offsets {self.path}: {exc}") from exc
        try:
            self.offsets = {
                (topic, int(q)): int(off) for topic, queues in raw.items() for q, off in queues.items()
            }
        except (AttributeError, TypeError, ValueError) as exc:
            raise ConfigError(f"malformed broadcast offsets file {self.path}: {exc}") from exc

    def get(self, topic: str, queue_id: int) -> int:
        """The stored offset, or -1 when none."""
        return self.offsets.get((topic, queue_id), -1)

    def save(self, updates: dict[tuple[str, int], int]) -> None:
        """Merge ``updates`` and write the file atomically (blocking: run in a thread)."""
        self.offsets.update(updates)
        doc: dict[str, dict[str, int]] = {}
        for (topic, q), off in sorted(self.offsets.items()):
            doc.setdefault(topic, {})[str(q)] = off
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        try:
            fd = os.open(self.path.parent, os.O_RDONLY)
        except OSError:  # pragma: no cover - platforms without directory fds
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
