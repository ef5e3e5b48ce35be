"""The chat page's files panel: a file's page, its download, and an upload.

The panel (`sessions/_files.html`, rendered by `{% files_panel %}` in
web/tags.py) lists the session's documents (actions.workspace_files). Each
name opens the file's page, each row has a download link, and whoever may
drive the session gets an upload form. Every view asks the one access rule
first (actions.session_for): another user's session is a 404, as is a file
that does not exist (web/errors.py turns UnknownDocument into the page).

An upload is an ordinary durable write: it goes through the API's PUT verb
(actions.write_document), so it is one committed version logged as
`document/written` by the user, held to the profile's bounds, and the agent
reads it with workspace.read on its next turn like any file. htmx gets the
panel back (200, so it swaps, with the error in it and its code in
X-Terret-Error); a plain POST a redirect to the chat with a message.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import PurePosixPath
from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.template.defaultfilters import filesizeformat
from django.urls import URLPattern, path, reverse
from django.utils.html import escape
from django.utils.http import content_disposition_header
from django.utils.safestring import SafeString, mark_safe
from django.views.decorators.http import require_GET, require_POST
from pygments import highlight as pygments_highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_for_filename
from pygments.util import ClassNotFound

from sessions_app import actions
from sessions_app.actions import session_for
from sessions_app.actions.files import FileVersion, upload_limit, workspace_file, workspace_files
from sessions_app.errors import InvalidInput, NotAllowed, TerretError, UnknownSession
from sessions_app.models import Session
from sessions_app.web import panels

PANEL = "sessions/_files.html"
# A larger file's page shows its size and a download link, not its text:
# a page of megabytes helps nobody read it.
MAX_VIEW_BYTES = 256 * 1024
# Highlighting is linear but not cheap; longer text is shown escaped, as is.
MAX_HIGHLIGHT_CHARS = 64 * 1024
# Token spans only: the page wraps them in its own <pre><code>.
_FORMATTER = HtmlFormatter(nowrap=True)


class UploadForm(forms.Form):
    # An empty file is a file too (an empty notes.txt is a fine document).
    file = forms.FileField(allow_empty_file=True, label="File")
    name = forms.CharField(
        required=False,
        max_length=1024,
        strip=True,
        label="Save as",
        help_text="optional: a path, or a folder ending in /",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Its own ids: the chat page's composer and schedules form have theirs.
        kwargs.setdefault("auto_id", "upload_%s")
        super().__init__(*args, **kwargs)

    def target(self) -> str:
        """The document's name: "Save as", or the upload's own name (Django
        keeps only its last part), put in the folder "Save as" names when it
        ends in /. The store checks the name (no .., no NUL...)."""
        upload, name = self.cleaned_data["file"], self.cleaned_data["name"]
        if not name:
            return str(upload.name)
        return f"{name}{upload.name}" if name.endswith("/") else str(name)


def panel_context(session: Session, user: Any, **extra: Any) -> dict[str, Any]:
    return {
        "session": session,
        "files": workspace_files(user, session.id),
        "can_drive": actions.allowed(user, session, "drive"),
        "files_limit": upload_limit(session),
        "upload_form": extra.pop("form", None) or UploadForm(),
        **extra,
    }


def _version(request: HttpRequest) -> int | None:
    raw = request.GET.get("version")
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError("version must be a positive integer")
    return int(raw)


def _basename(name: str) -> str:
    return PurePosixPath(name).name or "download"


def highlighted(name: str, text: str) -> tuple[SafeString, str]:
    """`text` as HTML, and the language it was highlighted as ("" for none):
    Pygments' token spans when the name's extension names a lexer (its
    output escapes the text: a class can come only from Pygments), else the
    text escaped."""
    if len(text) <= MAX_HIGHLIGHT_CHARS:
        try:
            lexer = get_lexer_for_filename(_basename(name), stripnl=False, ensurenl=False)
        except ClassNotFound:
            lexer = None
        if lexer is not None and "text" not in lexer.aliases:
            label = lexer.aliases[0] if lexer.aliases else lexer.name
            return mark_safe(pygments_highlight(text, lexer, _FORMATTER)), label  # noqa: S308 - escaped by Pygments
    return escape(text), ""


def shown(file: FileVersion) -> dict[str, Any]:
    """What the file's page shows: the text (`shown`), or why not (`why`)."""
    if file.size > MAX_VIEW_BYTES:
        return {"shown": None, "why": f"Too large to show here (more than {filesizeformat(MAX_VIEW_BYTES)})"}
    try:
        text = file.data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is None or "\x00" in text:
        return {"shown": None, "why": "A binary file"}
    html, lang = highlighted(file.name, text)
    return {"shown": html, "lang": lang}


@login_required
@require_GET
def view(request: HttpRequest, session_id: uuid.UUID, name: str) -> HttpResponse:
    """A file's page: its text (highlighted by its extension, escaped), or
    its size and a download link; `?version=N` for an older version."""
    session = session_for(request.user, session_id, "view")
    try:
        version = _version(request)
        file = workspace_file(request.user, session.id, name, version)
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    except InvalidInput as exc:  # a name no document can have (.., NUL)
        return HttpResponseBadRequest(str(exc))
    context = {
        "session": session,
        "file": file,
        "chat_url": reverse("sessions:chat", args=[session.id]),
        **shown(file),
    }
    return render(request, "sessions/file.html", context)


@login_required
@require_GET
def download(request: HttpRequest, session_id: uuid.UUID, name: str) -> HttpResponse:
    """The file's bytes as an attachment; `?version=N` for an older version."""
    session = session_for(request.user, session_id, "view")
    try:
        content = actions.document(request.user, session.id, name, _version(request)).content
    except ValueError as exc:
        return HttpResponseBadRequest(str(exc))
    except InvalidInput as exc:
        return HttpResponseBadRequest(str(exc))
    # Never a type a browser would render or run: text as plain text, the
    # rest as bytes; nosniff so no browser guesses otherwise, and a sandbox
    # so a browser that shows it anyway runs nothing of it.
    is_text = content.text() is not None
    response = HttpResponse(
        content.data, content_type="text/plain; charset=utf-8" if is_text else "application/octet-stream"
    )
    response["Content-Disposition"] = content_disposition_header(True, _basename(content.info.name))
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox"
    # The head changes with every write; the page must not serve a stale one.
    response["Cache-Control"] = "private, no-cache"
    return response


def _answer(
    request: HttpRequest, session: Session, *, notice: str = "", error: str = "", code: str = "", form: Any = None
) -> HttpResponse:
    def context() -> dict[str, Any]:
        return panel_context(session, request.user, form=form, files_notice=notice, files_error=error)

    return panels.answer(
        request, session, template=PANEL, context=context, notice=notice, error=error, code=code, anchor="files"
    )


@login_required
@require_POST
def upload(request: HttpRequest, session_id: uuid.UUID) -> HttpResponse:
    """Upload a file into the session's documents: its next version, by the
    user, through the API's write verb (the module docstring)."""
    session = session_for(request.user, session_id, "drive")
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        problems = " ".join(str(e) for errors in form.errors.values() for e in errors)
        return _answer(request, session, error=f"Nothing uploaded: {problems}", form=form)
    upload, name = form.cleaned_data["file"], form.target()
    limit = upload_limit(session)
    if upload.size > limit:
        # Refused before the upload is read into memory; the store would
        # refuse it too, with the same bound.
        error = f"Nothing uploaded: {name} is {upload.size} bytes; a document's bound is {limit} (max_document_bytes)"
        return _answer(request, session, error=error, code="document_too_large", form=form)
    # The API's body: the bytes base64-encoded, so one verb and one check of
    # the content serve both doors.
    body = {"content": base64.b64encode(upload.read()).decode("ascii"), "encoding": "base64"}
    try:
        written = actions.write_document(request.user, session.id, name, body)
    except (UnknownSession, NotAllowed):
        raise
    except TerretError as exc:
        return _answer(request, session, error=f"Nothing uploaded: {exc}", code=exc.code, form=form)
    notice = f"Uploaded {written['name']}: version {written['version']}, {filesizeformat(written['size'])}."
    return _answer(request, session, notice=notice)


urlpatterns: list[URLPattern] = [
    path("sessions/<uuid:session_id>/files/view/<path:name>", view, name="file_view"),
    path("sessions/<uuid:session_id>/files/download/<path:name>", download, name="file_download"),
    path("sessions/<uuid:session_id>/files/upload/", upload, name="file_upload"),
]
