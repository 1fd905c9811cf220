"""tools/bench/receiver.py's reading of the consumer's file, a line at a time as it is written."""

from __future__ import annotations

from pathlib import Path

from tools.bench.receiver import Receiver


async def test_a_line_still_being_written_is_read_once_it_is_whole(tmp_path: Path) -> None:
    out = tmp_path / "receipts.jsonl"
    out.write_text('["s-a", 1.5, 1.52]\n["s-b", 2.0, ')
    async with Receiver(out) as receiver:
        assert receiver.take() == [("s-a", 1.5, 1.52)]
        assert receiver.take() == []
        with out.open("a") as f:
            f.write('2.01]\n["s-c", 3.0, 3.0')
        assert receiver.take() == [("s-b", 2.0, 2.01)]
        with out.open("a") as f:
            f.write("4]\n")
        assert receiver.take() == [("s-c", 3.0, 3.04)]
