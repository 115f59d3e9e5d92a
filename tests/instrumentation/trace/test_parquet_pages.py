"""The page-header walk that bounds what a parquet file's pages decompress to: it agrees with
the footers of every bundled table, reads a hand-encoded header's claim, and refuses a
chunk whose pages or headers run past it."""

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from instrumentation.trace.parquet_pages import PageFormatError, chunk_pages

DATA = Path(__file__).resolve().parents[3] / "data"


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _i32(fid_delta: int, value: int) -> bytes:          # compact protocol: short-form i32 field
    return bytes([(fid_delta << 4) | 5]) + _varint((value << 1) ^ (value >> 31))


def _data_page(uncompressed: int, compressed: int, values: int) -> bytes:
    header = (_i32(1, 0) + _i32(1, uncompressed) + _i32(1, compressed)
              + bytes([(2 << 4) | 12]) + _i32(1, values) + _i32(1, 0) + b"\x00"   # field 5: struct
              + b"\x00")
    return header + bytes(compressed)


def test_a_headers_claim_is_what_the_walk_returns():
    page = _data_page(2**31 - 1, 16, 10**8)
    data = b"PAR1" + page + page
    pages = chunk_pages(data, 4, 2 * len(page))
    assert pages.uncompressed == 2 * (2**31 - 1) and pages.values == 2 * 10**8
    with pytest.raises(PageFormatError, match="a page runs past"):
        chunk_pages(data, 4, len(page) - 3)
    with pytest.raises(PageFormatError, match="header runs past"):
        chunk_pages(data, 4, len(page) + 1)
    with pytest.raises(PageFormatError, match="outside the file"):
        chunk_pages(data, 4, 10 * len(data))


def test_the_walk_agrees_with_every_bundled_footer():
    files = sorted(DATA.glob("*/**/*.parquet"))
    assert len(files) > 100
    for f in files:
        data = f.read_bytes()
        md = pq.ParquetFile(f).metadata
        for i in range(md.num_row_groups):
            rg = md.row_group(i)
            for j in range(rg.num_columns):
                c = rg.column(j)
                start = min(o for o in (c.dictionary_page_offset if c.has_dictionary_page else 0,
                                        c.data_page_offset) if o) if c.total_compressed_size else 0
                pages = chunk_pages(data, start, c.total_compressed_size)
                assert pages.values == c.num_values == rg.num_rows, f
                assert pages.uncompressed <= c.total_uncompressed_size, f
