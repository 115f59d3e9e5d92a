"""User-supplied text shown as text: URL values, trace metadata, upload names, and messages
that quote them. Streamlit renders messages, captions and titles as Markdown, so a link value
`[Open the corrected view](http://...)` would become a clickable link and `![t](http://...)`
an image the browser fetches; `plain()` makes such text render as exactly its characters."""

from __future__ import annotations

import re

_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")     # every ASCII punctuation mark
# Streamlit also turns bare URLs, www. names and e-mail addresses in text into links (GFM
# autolink literals, found after escapes are resolved): a zero-width space breaks each pattern
_AUTOLINK = re.compile(r"(:)(//)|(?i:(www))(\.)|(@)")
_ZWSP = "\u200b"


def plain(value) -> str:
    """`value` as Markdown that shows its characters and nothing else: every ASCII punctuation
    mark is backslash-escaped (CommonMark allows that for all of them), which keeps links,
    images, HTML, :color[...] directives and $math$ as text, and a zero-width space inside
    '://', 'www.' and '@' keeps bare URLs and addresses from being linked. Line breaks become
    spaces: a message stays one line. Not for use inside `code` spans."""
    text = " ".join(str(value).splitlines())
    text = _AUTOLINK.sub(lambda m: _ZWSP.join(g for g in m.groups() if g is not None)
                         + (_ZWSP if m.group(5) else ""), text)
    return _PUNCTUATION.sub(r"\\\1", text)
