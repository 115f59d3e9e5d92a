"""What a parquet file's pages will cost to decode, read from their headers before any page is
decompressed.

A footer can claim small sizes while a page header asks for a 2 GB buffer: the decoder trusts
the page header. This walks each column chunk's page headers (Thrift compact protocol, the
fields it needs) and returns the bytes the pages decompress to and the values they hold, so
the loader can refuse a file whose pages disagree with its footer or exceed the budget.
"""

from __future__ import annotations

from typing import NamedTuple

# Thrift compact protocol type ids
_STOP, _TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(13)
_DATA_PAGE, _INDEX_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = range(4)
_MAX_DEPTH = 16


class PageFormatError(ValueError):
    """A page header that cannot be read."""


class ChunkPages(NamedTuple):
    uncompressed: int        # bytes the pages decompress to (headers' uncompressed_page_size)
    values: int              # values of its data pages (num_values)


class _Reader:
    def __init__(self, data: bytes, pos: int, end: int):
        self.data, self.pos, self.end = data, pos, end

    def byte(self) -> int:
        if self.pos >= self.end:
            raise PageFormatError("a page header runs past its column chunk")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7
            if shift > 63:
                raise PageFormatError("a varint is too long")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def skip_bytes(self, n: int) -> None:
        if n < 0 or self.pos + n > self.end:
            raise PageFormatError("a page header runs past its column chunk")
        self.pos += n

    def skip(self, kind: int, depth: int) -> None:
        if depth > _MAX_DEPTH:
            raise PageFormatError("a page header is nested too deeply")
        if kind in (_TRUE, _FALSE):
            return
        if kind == _BYTE:
            self.skip_bytes(1)
        elif kind in (_I16, _I32, _I64):
            self.varint()
        elif kind == _DOUBLE:
            self.skip_bytes(8)
        elif kind == _BINARY:
            self.skip_bytes(self.varint())
        elif kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            for _ in range(size):
                self.skip(elem, depth + 1)
        elif kind == _MAP:
            size = self.varint()
            if size:
                types = self.byte()
                for _ in range(size):
                    self.skip(types >> 4, depth + 1)
                    self.skip(types & 0x0F, depth + 1)
        elif kind == _STRUCT:
            self.struct(depth + 1)
        else:
            raise PageFormatError(f"unknown Thrift type {kind}")

    def struct(self, depth: int, want=None) -> dict:
        """Read a struct; return {field id: value} of the i32 fields and the sub-structs `want`
        names ({field id: want of that struct}), skipping everything else."""
        out, last = {}, 0
        while True:
            head = self.byte()
            kind = head & 0x0F
            if kind == _STOP:
                return out
            delta = head >> 4
            fid = last + delta if delta else self.zigzag()
            last = fid
            if kind == _I32:
                out[fid] = self.zigzag()
            elif kind == _STRUCT and want and fid in want:
                out[fid] = self.struct(depth + 1, want[fid])
            else:
                self.skip(kind, depth)


def chunk_pages(data: bytes, start: int, length: int) -> ChunkPages:
    """Walk the pages of one column chunk (`length` bytes from `start`) by their headers.

    Arguments: data, the whole file; start, the chunk's first page (dictionary page offset if
    any, else data page offset); length, its total_compressed_size.
    Returns: ChunkPages(uncompressed bytes, data-page values). Raises PageFormatError.
    """
    if length == 0:
        return ChunkPages(0, 0)
    end = start + length
    if start < 4 or length < 0 or end > len(data):
        raise PageFormatError("a column chunk lies outside the file")
    pos, uncompressed, values = start, 0, 0
    while pos < end:
        r = _Reader(data, pos, end)
        h = r.struct(0, want={5: {}, 8: {}})       # data_page_header, data_page_header_v2
        kind, size, compressed = h.get(1), h.get(2, -1), h.get(3, -1)
        if size < 0 or compressed < 0:
            raise PageFormatError("a page header has no sizes")
        uncompressed += size
        if kind == _DATA_PAGE:
            values += h.get(5, {}).get(1, 0)
        elif kind == _DATA_PAGE_V2:
            values += h.get(8, {}).get(1, 0)
        pos = r.pos + compressed
        if pos > end:
            raise PageFormatError("a page runs past its column chunk")
    return ChunkPages(uncompressed, values)
