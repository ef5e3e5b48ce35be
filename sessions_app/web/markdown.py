"""Message text as safe HTML: Markdown rendered on the server, then sanitized.

markdown-it-py renders CommonMark (plus tables and strikethrough) with raw
HTML turned off, so any tag a model or a user types comes out as text. nh3
(the Ammonia sanitizer) then cleans the result against an allow-list of tags,
attributes and URL schemes as a second line: a `javascript:` link, an event
handler attribute or a `<script>` cannot survive either step. Only after
sanitizing does each code block get its copy button; the button is added to
markup nh3 has already cleaned, so nothing the text contains can forge one.
"""

from __future__ import annotations

import functools
import re

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

# Longer text is shown escaped, as typed: rendering is linear, but a model's
# 1 MB reply would cost a page view more than it is worth.
MAX_MARKDOWN_CHARS = 200_000

ALLOWED_TAGS = frozenset(
    {
        "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote",
        "ul", "ol", "li", "a", "h1", "h2", "h3", "h4", "h5", "h6",
        "table", "thead", "tbody", "tr", "th", "td",
    }
)  # fmt: skip
ALLOWED_ATTRIBUTES = {
    "a": {"href", "title"},
    "ol": {"start"},
    "th": {"style"},
    "td": {"style"},
}
# No <img>: a remote image in a reply would report who read it, and when.
URL_SCHEMES = frozenset({"http", "https", "mailto"})
_PRE = re.compile(r"<pre>")
COPY_BUTTON = '<div class="code-block"><button type="button" class="copy-code" title="Copy the code">Copy</button><pre>'


@functools.cache
def _parser() -> MarkdownIt:
    # "commonmark" with html off: raw HTML in the text is escaped, not passed on.
    return MarkdownIt("commonmark", {"html": False, "linkify": False, "breaks": True}).enable(
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
    return _PRE.sub(COPY_BUTTON, clean).replace("</pre>", "</pre></div>")
