"""`schedule --from-file`'s reading of its file (worker/ops/cli_import.py): a line at a time, none
held past the bound, whatever the file holds."""

from __future__ import annotations

import io

from worker.ops.cli_import import _lines

LIMIT = 10


class Bounded(io.BytesIO):
    """A file that records the most it was asked to read at once; a read without a bound fails."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.most = 0

    def readline(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size >= 0, "a line read whole, however long"
        self.most = max(self.most, size)
        return super().readline(size)

    def read(self, size: int | None = -1, /) -> bytes:
        assert size is not None and size >= 0, "the file read whole"
        self.most = max(self.most, size)
        return super().read(size)


def test_a_line_past_the_bound_is_skipped_by_its_number_without_being_held() -> None:
    fits = b"x" * LIMIT + b"\n"  # LIMIT bytes and its line end: taken
    over = b"y" * (LIMIT + 1) + b"\n"
    huge = b"z" * (100 * LIMIT) + b"\n"
    stream = Bounded(b'{"a": 1}\n' + fits + over + huge + b"\n" + b"z" * (3 * LIMIT))
    assert list(_lines(stream, LIMIT)) == [
        (1, b'{"a": 1}\n', 9),
        (2, fits, LIMIT + 1),
        (3, None, LIMIT + 2),
        (4, None, 100 * LIMIT + 1),
        (5, b"\n", 1),
        (6, None, 3 * LIMIT),  # the last line, without a line end
    ]
    assert stream.most <= LIMIT + 1


def test_the_last_line_needs_no_line_end() -> None:
    assert list(_lines(Bounded(b"a\nbc"), LIMIT)) == [(1, b"a\n", 2), (2, b"bc", 2)]
    assert list(_lines(Bounded(b""), LIMIT)) == []
