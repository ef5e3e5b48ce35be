"""Message text as safe HTML: Markdown rendered on the server, then sanitized.

markdown-it-py renders CommonMark (plus tables and strikethrough) with raw
HTML turned off, so any tag a model or a user types comes out as text. nh3
(the Ammonia sanitizer) then cleans the result against an allow-list of tags,
attributes and URL schemes as a second line: a `javascript:` link, an event
handler attribute or a `<script>` cannot survive either step. Only after
sanitizing does each code block get its copy button; the button is added to
markup nh3 has already cleaned, so nothing the text contains can forge one.

A fenced block that names its language is highlighted by Pygments (its
output is escaped text in <span class="..."> tokens; static/css/code.css
colours them, light and dark) and labelled with the language. nh3 lets
`class` through on <span> and <code> only, and no raw HTML reaches it from
the text, so a class can come only from Pygments or markdown-it.
"""

from __future__ import annotations

import functools
import re

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

# Longer text is shown escaped, as typed: rendering is linear, but a model's
# 1 MB reply would cost a page view more than it is worth.
MAX_MARKDOWN_CHARS = 200_000

ALLOWED_TAGS = frozenset(
    {
        "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
        "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
        "table", "thead", "tbody", "tr", "th", "td", "span",
    }
)  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "ol": {"start"},
    "th": {"style"},
    "td": {"style"},
    # Pygments' token classes and markdown-it's language-NAME (see the module's note).
    "span": {"class"},
    "code": {"class"},
}
# No <img>: a remote image in a reply would report who read it, and when.
URL_SCHEMES = frozenset({"http", "https", "mailto"})
_PRE = re.compile(r'<pre>(<code class="language-([^"<>]{1,40})">)?')
COPY_BUTTON = '<div class="code-block"><button type="button" class="copy-code" title="Copy the code">Copy</button><pre>'
# A block longer than this is shown unhighlighted: highlighting is linear,
# but a huge paste would cost a page view more than it is worth.
MAX_HIGHLIGHT_CHARS = 20_000
_FORMATTER = HtmlFormatter(nowrap=True)


def highlight(code: str, lang: str, _attrs: str) -> str:
    """markdown-it's hook: `code` as Pygments' token spans, or "" (markdown-it
    then escapes it as is) for an unknown language or a long block."""
    if not lang or len(code) > MAX_HIGHLIGHT_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(lang, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return str(pygments_highlight(code, lexer, _FORMATTER))


def _code_block(match: re.Match[str]) -> str:
    """A block's copy button, and its language's label when it names one."""
    code, lang = match.group(1) or "", match.group(2)
    label = f'<span class="code-lang">{lang}</span>' if lang else ""
    return COPY_BUTTON.replace("<pre>", f"{label}<pre>") + code


@functools.cache
def _parser() -> MarkdownIt:
    # "commonmark" with html off: raw HTML in the text is escaped, not passed on.
    return MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True, "highlight": highlight}).enable(
        ["table", "strikethrough"]
    )


def sanitize(html: str) -> str:
    return nh3.clean(
        html,
        tags=set(ALLOWED_TAGS),
        attributes={k: set(v) for k, v in ALLOWED_ATTRIBUTES.items()},
        url_schemes=set(URL_SCHEMES),
        link_rel="noopener noreferrer nofollow",
        filter_style_properties={"text-align"},
        strip_comments=True,
    )


def render_markdown(text: str) -> SafeString:
    """`text` as sanitized HTML, each code block with a copy button."""
    if not text:
        return mark_safe("")
    if len(text) > MAX_MARKDOWN_CHARS:
        return mark_safe(f"<pre class='plain'>{nh3.clean_text(text)}</pre>")  # noqa: S308 - escaped by clean_text
    html = _cached(text) if len(text) <= CACHED_CHARS else _render(text)
    return mark_safe(html)  # noqa: S308 - sanitized by nh3 (_render)


# Every page following a session renders each new message once per socket
# (and a page view renders up to 200): the same text, the same HTML. A reply
# of a few hundred characters takes about a millisecond, so recent ones are
# kept, up to CACHED_CHARS each (at most a few MB in all).
CACHED_CHARS = 8_000


@functools.lru_cache(maxsize=512)
def _cached(text: str) -> str:
    return _render(text)


def _render(text: str) -> str:
    clean = sanitize(_parser().render(text))
    # nh3 re-serializes, so a literal "<pre>" in the cleaned markup is an
    # element it let through, never text (text would read "&lt;pre&gt;").
    return _PRE.sub(_code_block, clean).replace("</pre>", "</pre></div>")
