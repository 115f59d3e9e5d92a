"""User-supplied text shown as text: URL values, trace metadata, upload names, and messages
that quote them. Streamlit renders messages, captions and titles as Markdown, so a link value
`[Open the corrected view](http://...)` would become a clickable link and `![t](http://...)`
an image the browser fetches; `plain()` makes such text render as exactly its characters."""

from __future__ import annotations

import re

# what Markdown (and Streamlit's extensions) would act on: link and image brackets, autolinks
# and HTML in <>, emphasis, code, math, strikethrough, tables, entities, headings; a colon
# before a letter (:red[...], :material/icon:) or closing a ':name:' pair (an emoji shortcode:
# ':100:' would become one, and a time stamp like 22:50:39 sends the browser off for
# Streamlit's 260 kB emoji plugin); an underscore at a word edge (intraword ones are plain in
# CommonMark); a list marker at the start. Everything else stays as typed, so
# "mask sliding_window:64, N=1024." reads (and searches) the same.
_ALWAYS = re.compile(r"([\\`*\[\]<>$~|&#])")
_COLON = re.compile(r":(?=[A-Za-z])")
# Streamlit loads its emoji plugin when the raw Markdown matches :[\w+-][\w_+-]*: ; a backslash
# before the closing colon breaks the match (the colon itself may open the next pair)
_SHORTCODE = re.compile(r"(:[\w+-]+)(?=:)")
_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_LEADING = re.compile(r"^(\s*)(\d+(?=[.)])|[-+=>])")
# Streamlit also turns bare URLs, www. names and e-mail addresses in text into links (GFM
# autolink literals, found after escapes are resolved): a zero-width space breaks each pattern
_AUTOLINK = re.compile(r"(:)(//)|(?i:(www))(\.)|(@)")
_ZWSP = "\u200b"


def plain(value) -> str:
    """`value` as Markdown that shows its characters and nothing else (see the patterns above;
    CommonMark lets a backslash escape any ASCII punctuation), and a zero-width space inside
    '://', 'www.' and '@' keeps bare URLs and addresses from being linked. Line breaks become
    spaces: a message stays one line. Not for use inside `code` spans."""
    text = " ".join(str(value).splitlines())
    text = _AUTOLINK.sub(lambda m: _ZWSP.join(g for g in m.groups() if g is not None)
                         + (_ZWSP if m.group(5) else ""), text)
    text = _ALWAYS.sub(r"\\\1", text)
    text = _COLON.sub(r"\\:", text)
    text = _SHORTCODE.sub(r"\1\\", text)
    text = _UNDERSCORE.sub(r"\\_", text)
    return _LEADING.sub(lambda m: m.group(1) + (m.group(2) + "\\" if m.group(2)[0].isdigit()
                                                 else "\\" + m.group(2)), text)


# Ranges of keys and queries are half-open everywhere in the app, as in the traces' tables
# (key_start, key_end): [256, 320) holds keys 256 to 319.
RANGE_CONVENTION = "Ranges are half-open: [256, 320) holds positions 256 to 319 (as the tables' start, end)."


def key_range(start, end, what: str = "keys") -> str:
    """A half-open range as the app writes it: 'keys [256, 320)'.

    Arguments: start (first position), end (one past the last), what (the word before it).
    Returns the text; an empty range reads 'no keys'."""
    start, end = int(start), int(end)
    return f"no {what}" if end <= start else f"{what} [{start}, {end})"
