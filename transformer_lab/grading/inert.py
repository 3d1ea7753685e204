"""What of a student's notebook may reach a page, built from an allow-list.

Everything here takes text the student controls and returns HTML (or notebook outputs) that
can neither run, nor fetch, nor look like the grader's own words:

* :func:`sanitize_html`: nh3 (ammonia) with a list of text, table and MathML tags; no ``class``,
  ``id`` or ``style`` (nothing can borrow the score boxes' look); an ``<img>`` keeps only a
  ``data:`` PNG/JPEG/GIF source and numeric sizes; a link keeps its text, never its target.
* :func:`markdown_html`: a markdown cell **rendered first** (math to MathML, then nbconvert's own
  mistune renderer) and **sanitised after**, so what the renderer makes of ``![](http://...)``
  or ``[x](javascript:...)`` is what the sanitiser sees.
* :func:`safe_output`: a display output rebuilt from the kept MIME types (plain text, PNG, JPEG,
  sanitised HTML) with only each image's ``width``/``height`` as positive numbers; every other
  metadata key (``filenames``, ``unconfined``, ...) is dropped, since nbconvert writes them into
  the page unquoted or as an ``<img src>``.
* :func:`fixed_palette`: ANSI escape codes reduced to the 16 standard foreground colours, bold
  and reset; no background, inverse, 256-colour or 24-bit colour (those copy any colour, the score
  boxes' included).

Reference: nh3 (Python binding of ammonia); nbconvert's ``markdown2html_mistune``; ECMA-48 SGR.
"""

from __future__ import annotations

import html
import math
import re

import nbformat
from nbformat import NotebookNode

__all__ = [
    "IMAGE_TYPES",
    "KEPT_TYPES",
    "fixed_palette",
    "markdown_html",
    "math_to_mathml",
    "safe_output",
    "sanitize_html",
]

#: What a student's HTML may keep: text structure and tables (pandas), images, MathML.
_TEXT_TAGS = {
    *("a", "b", "i", "em", "strong", "code", "pre", "kbd", "samp", "var", "sub", "sup", "del"),
    *("p", "br", "hr", "span", "div", "ul", "ol", "li", "dl", "dt", "dd", "blockquote"),
    *("h1", "h2", "h3", "h4", "h5", "h6"),
    *("table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "img"),
}
_MATHML_TAGS = {
    *("math", "mi", "mn", "mo", "ms", "mtext", "mspace", "mrow", "mfrac", "msqrt", "mroot"),
    *("msub", "msup", "msubsup", "munder", "mover", "munderover", "mtable", "mtr", "mtd"),
    *("mstyle", "mpadded", "mphantom", "menclose", "semantics", "annotation"),
}
_ATTRIBUTES = {
    "img": {"src", "alt", "width", "height"},
    "td": {"colspan", "rowspan"},
    "th": {"colspan", "rowspan"},
    "math": {"display", "xmlns"},
    "mo": {"stretchy", "fence", "separator", "lspace", "rspace", "form"},
    "mi": {"mathvariant"},
    "mtable": {"columnalign"},
    "mstyle": {"displaystyle", "scriptlevel"},
    "mspace": {"width"},
    "annotation": {"encoding"},
}
#: Output types a student's cell keeps (HTML only after :func:`sanitize_html`).
KEPT_TYPES = ("text/plain", "image/png", "image/jpeg", "text/html")
IMAGE_TYPES = ("image/png", "image/jpeg")
_DATA_IMAGE = re.compile(r"data:image/(png|jpeg|gif);base64,[A-Za-z0-9+/=\s]*", re.I)
_BASE64 = re.compile(r"[A-Za-z0-9+/=\s]*")
_NUMBER = re.compile(r"\d{1,5}")
_MAX_SIZE = 10_000  # pixels: wider than any page, small enough to stay a plain number


def _attribute(tag: str, name: str, value: str) -> str | None:
    """nh3's last word on each kept attribute: sources only inline images, sizes only numbers."""
    if name == "src":
        return value if tag == "img" and _DATA_IMAGE.fullmatch(value.strip()) else None
    if name in ("width", "height") and tag == "img":
        return value if _NUMBER.fullmatch(value.strip()) else None
    return value


def sanitize_html(text: str) -> str:
    """``text`` with only inert HTML left: see the module docstring (nh3, i.e. ammonia).

    Links keep their text and lose their target; nothing can run (no script, no ``on*``
    attribute), load anything from elsewhere (no URL but an inline image's ``data:``), or borrow
    the grader's styles (no ``class``, ``id`` or ``style``).
    """
    import nh3

    return nh3.clean(
        text,
        tags=_TEXT_TAGS | _MATHML_TAGS,
        clean_content_tags={"script", "style"},
        attributes=_ATTRIBUTES,
        attribute_filter=_attribute,
        url_schemes={"data"},
        link_rel=None,
        strip_comments=True,
    )


def _tex(expression: str, display: bool) -> str:
    try:
        from latex2mathml.converter import convert
    except ImportError:  # the optional converter is missing: show the TeX as code
        return f"<code>{html.escape(expression)}</code>"
    try:
        return convert(expression, display="block" if display else "inline")
    except Exception:  # an expression the converter does not know: keep it readable
        return f"<code>{html.escape(expression)}</code>"


def math_to_mathml(markdown: str) -> str:
    """Replace ``$$...$$`` and ``$...$`` (outside code) by MathML."""
    parts = re.split(r"(```.*?```|`[^`\n]*`)", markdown, flags=re.S)
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # code: untouched
            out.append(part)
            continue
        part = re.sub(r"\$\$(.+?)\$\$", lambda m: _tex(m.group(1).strip(), True), part, flags=re.S)
        part = re.sub(r"(?<![\\$])\$([^$\n]+?)\$", lambda m: _tex(m.group(1), False), part)
        out.append(part)
    return "".join(out)


def markdown_html(source: str) -> str:
    """A markdown cell as inert HTML: math to MathML, rendered (nbconvert's mistune), sanitised."""
    from nbconvert.filters.markdown_mistune import markdown2html_mistune

    rendered = markdown2html_mistune(math_to_mathml(source))
    # Each heading's "¶" link is styled away by a class the sanitiser removes: drop it here.
    rendered = re.sub(r'<a class="anchor-link" href="#[^"<>]*">&#182;</a>', "", rendered)
    return sanitize_html(rendered)


_CSI = re.compile(r"\x1b\[([0-?]*)([ -/]*)([@-~])")
_OTHER_ESCAPE = re.compile(r"\x1b(?!\[)[@-_]?")
_KEPT_SGR = {0, 1, 22, 39, *range(30, 38), *range(90, 98)}


def _sgr(params: str) -> str:
    """One SGR sequence's parameters reduced to the fixed palette ("" when nothing is left)."""
    if not re.fullmatch(r"[0-9;]*", params):  # ":" sub-parameters, private modes: dropped
        return ""
    codes = [int(p) if p else 0 for p in params.split(";")]
    kept, i = [], 0
    while i < len(codes):
        code = codes[i]
        if code in (38, 48):  # extended colour: 5;n or 2;r;g;b
            mode = codes[i + 1] if i + 1 < len(codes) else None
            n = codes[i + 2] if mode == 5 and i + 2 < len(codes) else None
            if code == 38 and n is not None and n < 16:  # a standard colour by number
                kept.append(30 + n if n < 8 else 90 + n - 8)
            i += 3 if mode == 5 else 5 if mode == 2 else 2
            continue
        if code in _KEPT_SGR:
            kept.append(code)
        i += 1
    return f"\x1b[{';'.join(map(str, kept))}m" if kept else ""


def fixed_palette(text: str) -> str:
    """``text`` with every ANSI escape reduced to the fixed palette (see the module docstring)."""

    def one(match: re.Match[str]) -> str:  # SGR ("m", no intermediate bytes) or nothing
        return _sgr(match.group(1)) if match.group(3) == "m" and not match.group(2) else ""

    text = _CSI.sub(one, text)
    return _OTHER_ESCAPE.sub("", text)


def _text(value: object) -> str | None:
    """A MIME bundle's value as one string (nbformat may split it in lines), or None."""
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "".join(value)
    return value if isinstance(value, str) else None


def _size(value: object) -> int | None:
    """An image's width or height as a positive number of pixels, or None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or not 1 <= value <= _MAX_SIZE:
        return None
    return round(value)


def safe_output(output: NotebookNode) -> NotebookNode | None:
    """A display or result output rebuilt from the kept types and sizes, or None if none is left."""
    kept: dict[str, str] = {}
    for mime in KEPT_TYPES:
        value = _text(output.get("data", {}).get(mime))
        if value is None:
            continue
        if mime in IMAGE_TYPES:
            if not _BASE64.fullmatch(value):
                continue
        elif mime == "text/html":
            value = sanitize_html(value)
        else:
            value = fixed_palette(value)
        kept[mime] = value
    if not kept:
        return None
    metadata: dict[str, dict[str, int]] = {}
    given = output.get("metadata", {})
    for mime in IMAGE_TYPES:
        sizes = given.get(mime) if isinstance(given, dict) else None
        if mime in kept and isinstance(sizes, dict):
            valid = {k: _size(sizes.get(k)) for k in ("width", "height")}
            if any(v is not None for v in valid.values()):
                metadata[mime] = {k: v for k, v in valid.items() if v is not None}
    if output.get("output_type") == "execute_result":
        return nbformat.v4.new_output(
            "execute_result", data=kept, metadata=metadata, execution_count=None
        )
    return nbformat.v4.new_output("display_data", data=kept, metadata=metadata)
