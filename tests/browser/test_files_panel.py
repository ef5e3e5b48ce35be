"""Issue 34, point 3, in a real browser at 1280 and 375 px (daphne, its
in-process worker, Debian's chromium): the side panel's files panel uploads
a file (htmx, multipart), lists it with its version and writer, shows what
the agent writes and removes without a reload, opens its page, and its
download link answers with an attachment."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.browser.test_chat_page import WIDTHS, shot
from tests.helpers import document_text

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.redis]

NOTE = "Crew list:\n<b>Ada</b> & Grace\n"


@pytest.mark.parametrize("width", WIDTHS)
def test_a_file_is_uploaded_listed_viewed_and_downloaded(
    width: int,
    start_server: Callable[..., Any],
    new_page: Callable[..., Any],
    make_user: Callable[..., Any],
    demo_profile: Any,
) -> None:
    from sessions_app import services
    from sessions_app.models import DocumentVersion

    server = start_server(TERRET_WORKER="inprocess")
    alice = make_user("alice")
    session = services.create_session(alice, demo_profile)
    page = new_page(server, alice, width=width)
    page.goto(f"/sessions/{session.id}/")
    expect(page.locator("#live")).to_have_text("live")

    # The side panel's files panel: empty, with an upload form that fits the screen.
    page.locator("#panel-button").click()
    page.locator("#files summary").click()
    expect(page.locator("#files")).to_contain_text("No files yet")
    form = page.locator("#upload-form")
    expect(form).to_be_visible()
    box = form.bounding_box()
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, box

    # Upload (htmx swaps the panel): listed with v1 and its writer, and written by alice.
    page.locator("#upload_file").set_input_files(
        files=[{"name": "crew.txt", "mimeType": "text/plain", "buffer": NOTE.encode()}]
    )
    page.locator("#upload-button").click()
    expect(page.locator("#files-notice")).to_contain_text("Uploaded crew.txt: version 1")
    row = page.locator("#files-table tbody tr").filter(has_text="crew.txt")
    expect(row).to_have_count(1)
    expect(row.locator("td").nth(2)).to_have_text("v1")
    expect(row.locator("td").nth(3)).to_have_text("alice")
    assert document_text(session.id, "crew.txt") == NOTE
    assert list(DocumentVersion.objects.filter(document__session=session).values_list("version", "by")) == [
        (1, "alice")
    ]
    table = page.locator("#files-table").bounding_box()
    assert table["x"] >= 0 and table["x"] + table["width"] <= width, table
    shot(page, f"files-panel-{width}.png")

    # What the agent writes or removes shows up live (the page's socket swaps
    # the list and the count), and the open panel stays open.
    from sessions_app.runtime import documents

    documents.write(session.id, "notes/plan.md", b"# Plan\n", by="agent")
    written = page.locator("#files-table tbody tr").filter(has_text="notes/plan.md")
    expect(written).to_have_count(1)
    expect(written.locator("td").nth(3)).to_have_text("the agent")
    expect(page.locator("#files-count .badge")).to_have_text("2")
    expect(page.locator("#files details")).to_have_attribute("open", "")
    documents.retire(session.id, "notes/plan.md", by="agent")
    expect(written).to_have_count(0)
    expect(page.locator("#files-count .badge")).to_have_text("1")

    # The download link answers with the bytes, as an attachment.
    href = row.locator("a.file-download").get_attribute("href")
    answer = page.request.get(href)
    assert answer.status == 200
    assert answer.headers["content-disposition"] == 'attachment; filename="crew.txt"'
    assert answer.headers["x-content-type-options"] == "nosniff"
    assert answer.body() == NOTE.encode()
    with page.expect_download() as caught:
        row.locator("a.file-download").click()
    assert caught.value.suggested_filename == "crew.txt"

    # Its page shows the text, escaped.
    row.locator("a.file-link").click()
    expect(page.locator("h1.file-title")).to_have_text("crew.txt")
    expect(page.locator("#file-content pre")).to_contain_text("<b>Ada</b> & Grace")
    assert page.locator("#file-content b").count() == 0  # the markup is text, not a tag
    expect(page.locator("#file-facts")).to_contain_text("by alice")
    shot(page, f"files-view-{width}.png")
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    assert page.js_errors == []
