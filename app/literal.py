"""What a user named (kernel, role, event and file names, labels, paths, error text), shown
literally.

Streamlit reads the text of st.markdown, st.caption, st.title/subheader, st.info / warning /
error / success, st.table cells, metric labels and radio options as GitHub-flavoured Markdown
plus its own directives (``:red[...]``, emoji shortcodes, ``$math$``): ``RMSNorm.__call__``
would read "RMSNorm.**call**", ``make.<locals>.kernel`` would lose ``<locals>``. Plotly
reads ``<...>`` in titles, legends and hover text as tags. :func:`md` escapes a text for the
first, :func:`plotly` for the second, :func:`md_rows` the text cells of a table's rows.
Plain-text elements (selectbox options, st.dataframe cells, st.json, st.text) need neither.
"""

from __future__ import annotations

import re

__all__ = ["md", "code", "md_rows", "plotly"]

# Anywhere in a line: code spans, emphasis, links and images, raw HTML and autolinks, math,
# strikethrough, table cells, and a backslash before any of them.
_INLINE = re.compile(r"([\\`*_\[\]<$~|])")
# A colon before a letter starts a directive (":red[...]", ":abbr"); "&name;" is an entity.
_COLON = re.compile(r":(?=[A-Za-z])")
_ENTITY = re.compile(r"&(?=#|[A-Za-z])")
# At the start of a line (after up to 3 spaces), what opens a block: a heading, a block quote,
# a list item, a thematic break or a setext underline. The first character of the group is
# escaped (for an ordered list item, the "." or ")" after its number).
_BLOCK = re.compile(r"^( {0,3})(#{1,6}(?=\s|$)|>|[-+*](?=\s|$)|(\d{1,9})([.)])(?=\s|$)|[-=_*]+[ \t]*$)", re.MULTILINE)
# What Streamlit turns into an emoji or an icon whatever its colons are escaped with.
_SHORTCODE = re.compile(r":[\w+-]+:|:material/")


def code(text) -> str:
    """``text`` as a Markdown code span: shown exactly as it is, in a monospace font."""
    s = str(text).replace("\n", " ")
    fence = "`" * (max((len(m) for m in re.findall(r"`+", s)), default=0) + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or (s.startswith(" ") and s.endswith(" ") and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def md(text) -> str:
    """``text`` escaped so that Streamlit's Markdown shows it as it is (names, labels, paths,
    messages). Text that holds an emoji shortcode (``a::b::c`` holds ``:b:``) becomes a code
    span, the one form Streamlit never turns into an emoji."""
    s = str(text)
    if _SHORTCODE.search(s):
        return code(s)
    s = _INLINE.sub(r"\\\1", s)
    s = _COLON.sub(r"\\:", s)
    s = _ENTITY.sub(r"\\&", s)
    return _BLOCK.sub(_escape_block, s)


def _escape_block(m: re.Match) -> str:
    lead, mark, number, dot = m.group(1), m.group(2), m.group(3), m.group(4)
    if number is not None:
        return f"{lead}{number}\\{dot}"
    return f"{lead}\\{mark}"


def md_rows(rows: list[dict]) -> list[dict]:
    """The rows of an st.table (whose cells are Markdown) with every text cell escaped by
    :func:`md`; numbers stay numbers."""
    return [{k: md(v) if isinstance(v, str) else v for k, v in r.items()} for r in rows]


def plotly(text) -> str:
    """``text`` for a plotly title, legend entry, tick label or hover text: ``&``, ``<`` and
    ``>`` as entities (plotly reads ``<...>`` as a tag and drops tags it does not know)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
