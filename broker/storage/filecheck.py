"""Check LMDB's data file before it is mapped: a truncated ``data.mdb`` must be a
clear refusal, not a SIGBUS.

LMDB maps the whole file and reads pages straight from the map. When the file is
shorter than the pages its B-trees reference (a copy cut short, a filesystem that
lost the tail, a ``truncate``), touching such a page raises SIGBUS and the process
dies without a word; LMDB itself never compares the file's size with its meta pages.

This module reads the two meta pages with plain ``pread`` (LMDB's own layout, see
``MDB_meta`` in ``mdb.c``)::

    page 0 and page 1, each:  MDB_page header (16 bytes) | MDB_meta
    MDB_meta: u32 magic 0xBEEFC0DE | u32 version | ptr address | size_t mapsize
              | MDB_db free (48 bytes; its first u32 is the page size) | MDB_db main
              | pgno last_pg | txnid txnid

The meta with the larger txnid is the current one; the file must hold pages
``0 .. last_pg``. LMDB notes that "the file may be shorter if the freeDB lists the
final pages" (a page dirtied and freed in the last transaction is never written),
so when the file is short the free-page B-tree is walked, and only missing pages
that are not free make the file truncated. Native byte order and 64-bit page
numbers (LMDB's layout on the 64-bit hosts the broker supports).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Final

from equeue.errors import StoreDamaged, StoreTruncated

__all__ = ["DATA_FILE", "RECOVERY_HINT", "check_data_file"]

DATA_FILE: Final = "data.mdb"
_MAGIC: Final = 0xBEEFC0DE
_PAGEHDR: Final = 16
_META: Final = struct.Struct("=II")  # magic, version (at the page header's end)
_PSIZE_AT: Final = _PAGEHDR + 24  # mm_dbs[FREE_DBI].md_pad
_FREE_ROOT_AT: Final = _PSIZE_AT + 40  # mm_dbs[FREE_DBI].md_root
_LAST_AT: Final = _PAGEHDR + 24 + 2 * 48  # mm_last_pg, then mm_txnid
_U16: Final = struct.Struct("=H")
_U32: Final = struct.Struct("=I")
_U64: Final = struct.Struct("=Q")
_NODE: Final = struct.Struct("=HHHH")  # lo, hi, flags, key size
_P_BRANCH, _P_LEAF, _F_BIGDATA = 0x01, 0x02, 0x01
_NO_PAGE: Final = (1 << 64) - 1  # P_INVALID: an empty tree

#: how to recover a damaged store (every start-up refusal for damage ends with it)
RECOVERY_HINT: Final = (
    "restore the data directory from a copy or a replica (mdb_copy makes a consistent copy "
    "of a live store), or move it aside to start empty"
)


def check_data_file(directory: Path) -> None:
    """Refuse a ``data.mdb`` shorter than its meta pages say (nothing to check when
    there is none yet: LMDB creates it).

    Raises StoreTruncated naming the file, its size, the size it needs and how to
    recover; StoreDamaged when the meta pages cannot be read at all."""
    path = directory / DATA_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return  # created but never written: LMDB initialises it
        _check(fd, path, size)
    finally:
        os.close(fd)


def _check(fd: int, path: Path, size: int) -> None:
    head = os.pread(fd, _LAST_AT + 16, 0)
    if len(head) < _LAST_AT + 16:
        raise StoreTruncated(f"{path} is {size} bytes: too short to hold LMDB's meta pages; {RECOVERY_HINT}")
    magic, _version = _META.unpack_from(head, _PAGEHDR)
    if magic != _MAGIC:
        raise StoreDamaged(f"{path} is not an LMDB data file or its header is damaged (bad magic); {RECOVERY_HINT}")
    psize = _U32.unpack_from(head, _PSIZE_AT)[0]
    if psize < 512 or psize & (psize - 1) or psize > 1 << 16:
        raise StoreDamaged(f"{path}: its header names page size {psize}, which LMDB never writes; {RECOVERY_HINT}")
    metas = [head, os.pread(fd, _LAST_AT + 16, psize)]
    if size < 2 * psize:
        raise StoreTruncated(
            f"{path} is {size} bytes but needs at least {2 * psize} (its second meta page is missing); {RECOVERY_HINT}"
        )
    valid = [m for m in metas if _META.unpack_from(m, _PAGEHDR)[0] == _MAGIC]
    meta = max(valid, key=lambda m: _U64.unpack_from(m, _LAST_AT + 8)[0])
    last_pg = _U64.unpack_from(meta, _LAST_AT)[0]
    need = (last_pg + 1) * psize
    if size >= need:
        return
    # Pages past the end of the file are fine only if they are free (never read).
    free_root = _U64.unpack_from(meta, _FREE_ROOT_AT)[0]
    free = _free_pages(fd, psize, free_root, last_pg)
    first_missing = size // psize
    used = [p for p in range(first_missing, last_pg + 1) if p not in free] if free is not None else [last_pg]
    if not used:
        return
    raise StoreTruncated(
        f"{path} is truncated: {size} bytes, but its pages need {(max(used) + 1) * psize} "
        f"({last_pg + 1} pages of {psize} bytes); starting on it would crash (SIGBUS); {RECOVERY_HINT}"
    )


def _free_pages(fd: int, psize: int, root: int, last_pg: int) -> set[int] | None:
    """The page numbers LMDB's free-page B-tree (FREE_DBI) lists, or None when the
    tree itself cannot be read (one of its pages is missing or malformed)."""
    free: set[int] = set()
    if root == _NO_PAGE:
        return free
    stack, seen = [root], 0
    while stack:
        pg = stack.pop()
        seen += 1
        if pg > last_pg or seen > last_pg + 1:
            return None
        page = os.pread(fd, psize, pg * psize)
        if len(page) < psize:
            return None
        flags = _U16.unpack_from(page, 10)[0]
        lower = _U16.unpack_from(page, 12)[0]
        if not _PAGEHDR <= lower <= psize:
            return None
        for i in range((lower - _PAGEHDR) // 2):
            off = _U16.unpack_from(page, _PAGEHDR + 2 * i)[0]
            if off + _NODE.size > psize:
                return None
            lo, hi, nflags, ksize = _NODE.unpack_from(page, off)
            if flags & _P_BRANCH:
                stack.append(lo | hi << 16 | nflags << 32)
                continue
            if not flags & _P_LEAF:
                return None
            dsize, d = lo | hi << 16, off + _NODE.size + ksize
            if nflags & _F_BIGDATA:
                ov = _U64.unpack_from(page, d)[0]
                if ov > last_pg:
                    return None
                data = os.pread(fd, dsize, ov * psize + _PAGEHDR)
            else:
                data = page[d : d + dsize]
            if len(data) < 8:
                return None
            count = _U64.unpack_from(data, 0)[0]
            if 8 + 8 * count > len(data):
                return None
            free.update(struct.unpack_from(f"={count}Q", data, 8))
    return free
