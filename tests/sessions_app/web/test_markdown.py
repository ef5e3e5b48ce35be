"""Messages as safe Markdown (web/markdown.py): what renders, and an XSS
list that must stay inert, through the renderer and through the chat page."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.urls import reverse

from sessions_app import log
from sessions_app.models import Session
from sessions_app.web.markdown import render_markdown
from tests.helpers import client_for

# Each must come out with no live markup: no element, attribute or URL that runs script or loads anything.
XSS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    "<svg onload=alert(1)><circle r=1></svg>",
    "<iframe src=javascript:alert(1)></iframe>",
    '<a href="javascript:alert(1)">x</a>',
    "[click](javascript:alert(1))",
    "[click](JaVaScRiPt:alert(1))",
    "[click](data:text/html;base64,PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg==)",
    "![x](javascript:alert(1))",
    '![x](https://example.com/a.png "t" onerror=alert(1))',
    "<style>body{display:none}</style>",
    '<div style="background:url(javascript:alert(1))">x</div>',
    "<math><mtext><table><mglyph><style><img src=x onerror=alert(1)>",
    "<details open ontoggle=alert(1)>",
    '<form action="javascript:alert(1)"><button>x</button></form>',
    "<object data=javascript:alert(1)>",
    "<embed src=javascript:alert(1)>",
    "<base href=javascript:alert(1)//>",
    '<meta http-equiv="refresh" content="0;url=javascript:alert(1)">',
    "<<script>script>alert(1)<</script>/script>",
    "`<script>` is fine in code, and so is ```<img onerror=x>```",
    "[a](<javascript:alert(1)>)",
    "[a][ref]\n\n[ref]: javascript:alert(1)",
    '<a href="&#106;avascript:alert(1)">x</a>',
    "<textarea><script>alert(1)</script></textarea>",
]
SAFE_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li", "a",
    "h1", "h2", "h3", "h4", "h5", "h6", "table", "thead", "tbody", "tr", "th", "td", "div", "button",
    "span",  # Pygments' tokens and the code block's language label (class only: handlers and style are checked)
}  # fmt: skip


class Elements(HTMLParser):
    """Every element and attribute as a browser's parser would see them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))


def live_markup(html: str) -> list[str]:
    """What in `html` could run script or load something: unexpected elements,
    event handlers, style, and links whose scheme is not http(s) or mailto."""
    parser = Elements()
    parser.feed(html)
    bad = []
    for tag, attrs in parser.found:
        if tag not in SAFE_TAGS:
            bad.append(f"<{tag}>")
        if tag == "div" and attrs.get("class") != "code-block" or tag == "button" and attrs.get("class") != "copy-code":
            bad.append(f"<{tag} {attrs}>")
        for name, value in attrs.items():
            if name.startswith("on") or name in ("src", "srcdoc", "formaction", "action", "data"):
                bad.append(f"{tag}[{name}]")
            if name == "style" and value.replace(" ", "") not in (
                "text-align:left",
                "text-align:right",
                "text-align:center",
            ):
                bad.append(f"{tag}[style={value}]")
            if name == "href" and not re.match(r"(https?:|mailto:|#|/)", value.strip(), re.IGNORECASE):
                bad.append(f"{tag}[href={value}]")
    return bad


@pytest.mark.parametrize("text", XSS)
def test_the_xss_list_stays_inert(text: str) -> None:
    html = str(render_markdown(text))
    assert live_markup(html) == [], html


def test_markdown_renders_and_code_blocks_get_a_copy_button() -> None:
    html = str(render_markdown("# Plan\n\n**bold** and *em*, `x < y`\n\n- one\n- two\n\n```python\nprint('<hi>')\n```"))
    assert "<h1>Plan</h1>" in html and "<strong>bold</strong>" in html and "<em>em</em>" in html
    assert "<code>x &lt; y</code>" in html and "<li>one</li>" in html
    assert '<div class="code-block"><button type="button" class="copy-code"' in html
    # highlighted by Pygments (escaped text in token spans), labelled with its language
    assert '<span class="nb">print</span><span class="p">(</span><span class="s1">\'&lt;hi&gt;\'</span>' in html
    assert '<span class="code-lang">python</span><pre><code class="language-python">' in html
    assert html.count("copy-code") == 1  # inline code gets none


def test_an_unknown_language_is_labelled_but_plain_and_a_fence_cannot_break_out() -> None:
    html = str(render_markdown("```nosuchlang\na <b> c\n```"))
    assert '<span class="code-lang">nosuchlang</span>' in html and "a &lt;b&gt; c" in html
    html = str(render_markdown('```py" onclick="window.__xss=1\n1\n```'))
    assert "onclick" not in html and live_markup(html) == []
    plain = str(render_markdown("```\nno language\n```"))
    assert "code-lang" not in plain and "<span" not in plain


def test_links_keep_safe_schemes_with_rel() -> None:
    html = str(render_markdown("[docs](https://example.com/a) and [mail](mailto:a@b.c)"))
    assert 'href="https://example.com/a"' in html and 'href="mailto:a@b.c"' in html
    assert 'rel="noopener noreferrer nofollow"' in html


def test_a_typed_copy_button_is_text_not_a_button() -> None:
    html = str(render_markdown('<div class="code-block"><button class="copy-code">Copy</button><pre>x</pre></div>'))
    assert "<button" not in html and "&lt;button" in html


@pytest.mark.django_db
def test_the_chat_page_renders_messages_as_markdown_and_keeps_xss_inert(chat: Session) -> None:
    payload = "\n\n".join(XSS)
    log.append(chat.id, "user/message", {"text": "**hello** " + payload})
    log.append(
        chat.id, "assistant/message", {"content": "Here:\n\n```sh\necho hi\n```\n\n" + payload, "tool_calls": []}
    )
    page = client_for(chat.owner).get(reverse("sessions:chat", args=[chat.id])).content.decode()
    log_html = page[page.index('<ol id="log"') : page.index("</ol>", page.index('<ol id="log"'))]
    assert "<strong>hello</strong>" in log_html
    assert 'class="copy-code"' in log_html and '<span class="code-lang">sh</span>' in log_html
    assert '<span class="nb">echo</span><span class="w"> </span>hi' in log_html
    rows = re.findall(r'<div class="text md">(.*?)\n</div>', log_html, re.S)
    assert len(rows) == 2 and all("textarea" in html for html in rows)  # each row whole, to its last item
    for html in rows:
        assert live_markup(html) == []
    # Only the page's own scripts, each loaded from /static/: nothing inline in the body.
    body = page[page.index("<body") :]
    assert not re.search(r"<script(?![^>]*\bsrc=\"/static/)", body)


def test_too_long_text_is_escaped_not_rendered(monkeypatch: Any) -> None:
    from sessions_app.web import markdown

    monkeypatch.setattr(markdown, "MAX_MARKDOWN_CHARS", 10)
    html = str(render_markdown("**not bold** <script>"))
    assert "<strong>" not in html and "&lt;script&gt;" in html
