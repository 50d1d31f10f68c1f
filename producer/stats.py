"""What a producer's sends came to, counted per finished batch (cheap: no per-message work).

The lanes write (loop thread); anyone may read. A reader in another thread sees
every batch finished before its last hand-over with the loop (``flush`` returns
after its batches are counted).
"""

from __future__ import annotations

import attrs

from equeue import wire

__all__ = ["SendStats"]


@attrs.define
class SendStats:
    """Messages answered since the producer started.

    ``stored`` and ``scheduled`` are what the broker stored or scheduled for this
    producer; ``duplicates`` the messages of batches it answered as already stored
    (a resend, or a replay under the same producer id); ``failed`` the messages whose
    send failed for good, the first of those failures being ``first_error``.
    """

    stored: int = 0
    scheduled: int = 0
    duplicates: int = 0
    failed: int = 0
    first_error: BaseException | None = None

    def answered(self, messages: int, answer: wire.ProduceResponse) -> None:
        """A batch of ``messages`` was answered."""
        if answer.duplicate:
            self.duplicates += messages
        else:
            self.stored += answer.stored
            self.scheduled += answer.scheduled

    def failed_batch(self, messages: int, error: BaseException) -> None:
        """A batch of ``messages`` failed for good with ``error``."""
        self.failed += messages
        if self.first_error is None:
            self.first_error = error

    def counts(self) -> dict[str, int]:
        return {"stored": self.stored, "scheduled": self.scheduled, "duplicates": self.duplicates, "failed": self.failed}
