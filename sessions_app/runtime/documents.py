"""Documents: the agent's world, in the database (docs/documents.md).

A document is a named value of one session with a kind, a scope, an
incarnation and a history of committed versions. Every worker on every host
reads and writes the same documents, so nothing of the agent's world lives
on one host's disk.

- **Kinds.** `file`: text or bytes (the workspace.* tools' files); `json`: a
  JSON value, checked against its registered schema (`register_schema`)
  when it names one; any other kind is kept as opaque bytes.
- **Scopes.** `conversation` (the default, and the workspace's): a fork gets
  the versions in force at its fork point (historical) or at its admission
  (current); `session`: state of the session rather than of the
  conversation, which a fork takes as it stands now under either policy;
  `task`: a task's scratch state, never copied to a fork, and retired with
  its task's terminal receipt (`retire_task`). A `fresh` fork gets none.
- **Versions.** Every write is one committed version, appended as
  `document/written` (fenced on the writer's lease when it has one) in the
  same transaction as the version's row, under the session's row lock. A
  version's `seq` is its document/written's seq (a fork's inherited versions
  carry seq 1, its session/forked), which is what makes "as of seq N" exact.
- **Incarnations.** `retire` ends a document (`document/retired`); writing
  its name again starts incarnation n+1 at version 1. A writer that passes
  the incarnation (and version) it read gets DocumentConflict when the
  document was recreated or written since: an old handle cannot reach the
  new incarnation.
- **Content** is stored once per sha256 (DocumentContent); versions point at
  it. The log holds the hash and size, never the bytes.
- **Bounds** (the live profile row, at every write): `max_document_bytes`
  per version, `max_session_document_bytes` for the session's live heads,
  `max_documents` live documents; each refused with DocumentTooLarge and a
  sentence naming the bound; nothing is written then.
- **Typed access** (json with a registered schema): `read_typed` migrates an
  older stored version in memory, step by step, and leaves history as it is
  (read-only migration); `migrate` commits the migrated value as a new
  version (write migration, `migrated_from` on its document/written). A
  stored version newer than the registered one, or an older one with a
  missing step, is DocumentVersionUnsupported.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import jsonschema_rs
from django.conf import settings
from django.db.models import Count, OuterRef, Q, Subquery, Sum

from sessions_app import log
from sessions_app.errors import (
    DocumentConflict,
    DocumentTooLarge,
    DocumentVersionUnsupported,
    InvalidInput,
    UnknownDocument,
)
from sessions_app.models import DOCUMENT_SCOPES, AgentProfile, Document, DocumentContent, DocumentVersion
from sessions_app.tools import documents as tool_documents

MAX_NAME_CHARS = 1024
KNOWN_KINDS = ("file", "json")
_KIND = re.compile(r"^[a-z][a-z0-9_.-]{0,31}$")
_FIELD = {f.name: f for f in AgentProfile._meta.concrete_fields}
TTL_FALLBACK = 30.0


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class Info:
    """A document's version as listed: its head, or the version asked for."""

    name: str
    kind: str
    scope: str
    incarnation: int
    version: int
    size: int
    sha256: str
    seq: int
    schema: str = ""
    schema_version: int | None = None
    task: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "scope": self.scope,
            "incarnation": self.incarnation,
            "version": self.version,
            "size": self.size,
            "sha256": self.sha256,
            "seq": self.seq,
            "schema": self.schema or None,
            "schema_version": self.schema_version,
        }


@dataclass(frozen=True)
class Content:
    info: Info
    data: bytes

    def text(self) -> str | None:
        """The content as UTF-8 text (None: it is not)."""
        try:
            return self.data.decode("utf-8")
        except UnicodeDecodeError:
            return None


@dataclass(frozen=True)
class Handle:
    """What a reader holds: writing through it fails once the document was
    recreated (another incarnation) or, with a version, written since."""

    session_id: uuid.UUID
    name: str
    incarnation: int
    version: int | None = None


# ---------------------------------------------------------------- names


def clean_name(name: Any) -> str:
    """A document name as a relative POSIX path, normalized ("a//b/./c" is
    "a/b/c"); InvalidInput for anything else."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidInput("path must be a non-empty string")
    if "\x00" in name:
        raise InvalidInput("path must not contain NUL bytes")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no column can store it
        raise InvalidInput("path must be valid Unicode text (no lone surrogates)") from None
    if len(name) > MAX_NAME_CHARS:
        raise InvalidInput(f"path is longer than {MAX_NAME_CHARS} characters")
    rel = PurePosixPath(name)
    if rel.is_absolute():
        raise InvalidInput("path must be relative to the workspace")
    if ".." in rel.parts:
        raise InvalidInput("path must not contain '..'")
    if rel.parts in ((), (".",)):
        raise InvalidInput("path must name a file inside the workspace")
    return rel.as_posix()


def _parents(name: str) -> list[str]:
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


# ---------------------------------------------------------------- reads


def _live(session_id: uuid.UUID, at_seq: int | None) -> Any:
    docs = Document.objects.filter(session_id=session_id)
    if at_seq is None:
        return docs.filter(retired_seq__isnull=True)
    return docs.filter(created_seq__lte=at_seq).filter(Q(retired_seq__isnull=True) | Q(retired_seq__gt=at_seq))


def _versions_of(doc: Document, at_seq: int | None, version: int | None) -> Any:
    qs = DocumentVersion.objects.filter(document=doc)
    if version is not None:
        return qs.filter(version=version)
    if at_seq is not None:
        return qs.filter(seq__lte=at_seq).order_by("-version")
    return qs.filter(version=doc.version)


def _info(doc: Document, v: DocumentVersion) -> Info:
    return Info(
        name=doc.name,
        kind=doc.kind,
        scope=doc.scope,
        incarnation=doc.incarnation,
        version=v.version,
        size=v.size,
        sha256=v.content_id,
        seq=v.seq,
        schema=doc.schema,
        schema_version=v.schema_version,
        task=doc.task,
    )


def listing(session_id: uuid.UUID, *, at_seq: int | None = None, limit: int = 10_000) -> list[Info]:
    """The session's live documents by name, each at its head (or as of
    `at_seq`: the documents and versions whose seqs are at or before it)."""
    docs = _live(session_id, at_seq)
    versions = DocumentVersion.objects.filter(document=OuterRef("pk"))
    if at_seq is not None:
        versions = versions.filter(seq__lte=at_seq)
    head = Subquery(versions.order_by("-version").values("pk")[:1])
    rows = list(docs.annotate(head_id=head).exclude(head_id=None).order_by("name")[:limit])
    by_id = DocumentVersion.objects.in_bulk([d.head_id for d in rows])  # type: ignore[attr-defined]
    return [_info(d, by_id[d.head_id]) for d in rows]  # type: ignore[attr-defined]


def _find(session_id: uuid.UUID, name: str, at_seq: int | None) -> Document:
    doc = _live(session_id, at_seq).filter(name=name).order_by("-incarnation").first()
    if doc is None:
        raise UnknownDocument(f"no document {name!r}")
    return doc


def read(session_id: uuid.UUID, name: Any, *, version: int | None = None, at_seq: int | None = None) -> Content:
    """A document's content: its head, a version of its live incarnation, or
    as of `at_seq`. UnknownDocument when there is none."""
    key = clean_name(name)
    doc = _find(session_id, key, at_seq)
    v = _versions_of(doc, at_seq, version).select_related("content").first()
    if v is None:
        raise UnknownDocument(f"document {key!r} has no version {version}" if version else f"no document {key!r}")
    return Content(_info(doc, v), bytes(v.content.data))


def head_digest(session_id: uuid.UUID, name: str) -> str | None:
    """The sha256 of a live document's head (None: no such document)."""
    doc = Document.objects.filter(session_id=session_id, name=name, retired_seq__isnull=True).first()
    if doc is None:
        return None
    head = DocumentVersion.objects.filter(document=doc, version=doc.version)
    return head.values_list("content_id", flat=True).first()


def totals(session_id: uuid.UUID) -> tuple[int, int]:
    """How many live documents the session holds, and their heads' bytes."""
    live = Document.objects.filter(session_id=session_id, retired_seq__isnull=True)
    agg = live.aggregate(n=Count("id"), b=Sum("size"))
    return int(agg["n"] or 0), int(agg["b"] or 0)


# ---------------------------------------------------------------- json schemas


Migration = Callable[[Any], Any]


@dataclass(frozen=True)
class Schema:
    """A json document's registered schema: `version` is the current one;
    `migrations[n]` lifts a value of version n to n + 1 (pure)."""

    name: str
    version: int
    schema: dict[str, Any]
    migrations: dict[int, Migration] = field(default_factory=dict)
    validator: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "validator", jsonschema_rs.validator_for(self.schema))


_SCHEMAS: dict[str, Schema] = {}


def register_schema(schema: Schema) -> None:
    _SCHEMAS[schema.name] = schema


def schema_named(name: str) -> Schema | None:
    return _SCHEMAS.get(name)


@dataclass(frozen=True)
class Typed:
    value: Any
    stored_version: int
    version: int  # the registered (current) version `value` is in

    @property
    def migrated(self) -> bool:
        return self.stored_version != self.version


def _lift(schema: Schema, value: Any, stored: int, name: str) -> Any:
    if stored > schema.version:
        raise DocumentVersionUnsupported(
            f"document {name!r} is at {schema.name} version {stored}; this code reads up to version {schema.version}"
        )
    for step in range(stored, schema.version):
        migrate_step = schema.migrations.get(step)
        if migrate_step is None:
            raise DocumentVersionUnsupported(
                f"document {name!r} is at {schema.name} version {stored}, and no migration "
                f"from version {step} to {step + 1} is registered"
            )
        value = migrate_step(value)
    return value


def read_typed(session_id: uuid.UUID, name: Any, *, version: int | None = None, at_seq: int | None = None) -> Typed:
    """A json document's value in its schema's current version: an older
    stored version is migrated here, in memory, and nothing is written."""
    content = read(session_id, name, version=version, at_seq=at_seq)
    info = content.info
    if info.kind != "json":
        raise InvalidInput(f"document {info.name!r} is a {info.kind} document, not json")
    value = json.loads(content.data)
    schema = _SCHEMAS.get(info.schema)
    if schema is None:
        raise DocumentVersionUnsupported(f"document {info.name!r} names schema {info.schema!r}, not registered here")
    stored = info.schema_version or 1
    lifted = _lift(schema, value, stored, info.name)
    if not schema.validator.is_valid(lifted):
        raise DocumentVersionUnsupported(f"document {info.name!r} does not match {schema.name} v{schema.version}")
    return Typed(lifted, stored, schema.version)


def migrate(session_id: uuid.UUID, name: Any, *, by: str = "", fence: log.Fence | None = None) -> Info:
    """Commit a json document's value migrated to its schema's current
    version as a new version (a write migration); its head is returned as
    is when already current."""
    typed = read_typed(session_id, name)
    content = read(session_id, name)
    if not typed.migrated:
        return content.info
    return write(
        session_id,
        name,
        json.dumps(typed.value, ensure_ascii=False, separators=(",", ":")).encode(),
        kind="json",
        scope=content.info.scope,
        schema=content.info.schema,
        schema_version=typed.version,
        migrated_from=typed.stored_version,
        expect=Handle(session_id, content.info.name, content.info.incarnation, content.info.version),
        by=by,
        fence=fence,
    )


def _check_json(data: bytes, schema_name: str, schema_version: int | None) -> int | None:
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidInput("a json document's content must be JSON") from None
    schema = _SCHEMAS.get(schema_name) if schema_name else None
    if schema is None:
        return schema_version
    version = schema.version if schema_version is None else schema_version
    if version > schema.version:
        raise DocumentVersionUnsupported(
            f"{schema.name} version {version} is newer than this code's ({schema.version}); nothing was written"
        )
    if version == schema.version and not schema.validator.is_valid(value):
        error = next(iter(schema.validator.iter_errors(value)))
        raise InvalidInput(f"the value does not match {schema.name} version {schema.version}: {error.message[:300]}")
    return version


# ---------------------------------------------------------------- writes


def _bound(profile_id: int | None, name: str) -> int:
    if profile_id is not None:
        value = AgentProfile.objects.filter(pk=profile_id).values_list(name, flat=True).first()
        if value is not None:
            return int(value)
    return int(_FIELD[name].default)


def _check_kind(kind: Any, scope: Any, task: str) -> None:
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise InvalidInput("kind must be a short lowercase name: file, json, or another kept as opaque data")
    if scope not in DOCUMENT_SCOPES:
        raise InvalidInput(f"scope must be one of {', '.join(DOCUMENT_SCOPES)}")
    if scope == "task" and not task:
        raise InvalidInput("a task-scoped document names its task")


def _check_paths(session_id: uuid.UUID, name: str) -> None:
    """The names stay a tree a directory can hold (materialize.py)."""
    live = Document.objects.filter(session_id=session_id, retired_seq__isnull=True)
    if live.filter(name__in=_parents(name)).exists():
        raise InvalidInput("a parent of the path is a file, not a directory")
    if live.filter(name__startswith=name + "/").exists():
        raise InvalidInput(f"{name} is a directory")


def _check_bounds(profile_id: int | None, session_id: uuid.UUID, name: str, size: int, old: Document | None) -> None:
    per_doc = _bound(profile_id, "max_document_bytes")
    if size > per_doc:
        raise DocumentTooLarge(f"{name} would be {size} bytes; a document's bound is {per_doc} (max_document_bytes)")
    count, total = totals(session_id)
    if old is None:
        most = _bound(profile_id, "max_documents")
        if count + 1 > most:
            raise DocumentTooLarge(f"the session holds {count} documents; the bound is {most} (max_documents)")
    after = total - (old.size if old is not None else 0) + size
    per_session = _bound(profile_id, "max_session_document_bytes")
    if after > per_session:
        raise DocumentTooLarge(
            f"the session's documents would hold {after} bytes; the bound is {per_session} (max_session_document_bytes)"
        )


def _check_expect(doc: Document | None, expect: Handle | None, name: str) -> None:
    if expect is None:
        return
    if doc is None or doc.incarnation != expect.incarnation:
        raise DocumentConflict(f"{name}: incarnation {expect.incarnation} is gone (retired, or recreated since)")
    if expect.version is not None and doc.version != expect.version:
        raise DocumentConflict(f"{name}: written since version {expect.version} (now version {doc.version})")


def store_content(data: bytes) -> str:
    """Store the bytes once (by sha256); the hash."""
    digest = hashlib.sha256(data).hexdigest()
    DocumentContent.objects.bulk_create(
        [DocumentContent(sha256=digest, data=data, size=len(data))], ignore_conflicts=True
    )
    return digest


def write(
    session_id: uuid.UUID,
    name: Any,
    data: bytes,
    *,
    kind: str = "file",
    scope: str = "conversation",
    by: str = "",
    fence: log.Fence | None = None,
    call_id: str = "",
    expect: Handle | None = None,
    schema: str = "",
    schema_version: int | None = None,
    migrated_from: int | None = None,
    task: str = "",
) -> Info:
    """Commit `data` as the document's next version (a new document, or a
    new incarnation of a retired name, at version 1), logged as
    document/written in the same transaction under the session's row lock.
    A live document keeps its kind, scope and schema. Raises InvalidInput,
    DocumentTooLarge, DocumentConflict, DocumentVersionUnsupported,
    LeaseLost; nothing is written then."""
    key = clean_name(name)
    if not isinstance(data, bytes):
        raise InvalidInput("content must be bytes")
    with log.locked(session_id, fence=fence) as tx:
        doc = Document.objects.filter(session_id=session_id, name=key, retired_seq__isnull=True).first()
        _check_expect(doc, expect, key)
        if doc is not None:
            kind, scope, schema, task = doc.kind, doc.scope, doc.schema, doc.task
        else:
            _check_kind(kind, scope, task)
            _check_paths(session_id, key)
        if kind == "json":
            schema_version = _check_json(data, schema, schema_version)
        _check_bounds(tx.row["profile_id"], session_id, key, len(data), doc)
        digest = store_content(data)
        if doc is None:
            last = Document.objects.filter(session_id=session_id, name=key).order_by("-incarnation").first()
            incarnation, version = (last.incarnation + 1 if last else 1), 1
        else:
            incarnation, version = doc.incarnation, doc.version + 1
        payload: dict[str, Any] = {
            "name": key,
            "kind": kind,
            "scope": scope,
            "incarnation": incarnation,
            "version": version,
            "sha256": digest,
            "size": len(data),
        }
        extras = {"schema": schema, "schema_version": schema_version, "migrated_from": migrated_from, "task": task}
        payload.update({k: v for k, v in extras.items() if v})
        if call_id:
            payload["call_id"] = call_id
        if by:
            payload["by"] = by
        event = tx.append("document/written", payload)
        if doc is None:
            doc = Document.objects.create(
                session_id=session_id,
                name=key,
                kind=kind,
                scope=scope,
                incarnation=incarnation,
                schema=schema,
                task=task,
                created_seq=event.seq,
            )
        doc.version, doc.size = version, len(data)
        doc.save(update_fields=["version", "size"])
        row = DocumentVersion.objects.create(
            document=doc,
            version=version,
            seq=event.seq,
            content_id=digest,
            size=len(data),
            schema_version=schema_version,
            by=by,
        )
    return _info(doc, row)


def retire(
    session_id: uuid.UUID,
    name: Any,
    *,
    by: str = "",
    reason: str = "deleted",
    fence: log.Fence | None = None,
    expect: Handle | None = None,
) -> int:
    """End the document's live incarnation (document/retired); its number.
    Its versions stay readable as of seqs before the retirement."""
    key = clean_name(name)
    with log.locked(session_id, fence=fence) as tx:
        doc = Document.objects.filter(session_id=session_id, name=key, retired_seq__isnull=True).first()
        if doc is None:
            raise UnknownDocument(f"no document {key!r}")
        _check_expect(doc, expect, key)
        payload: dict[str, Any] = {"name": key, "incarnation": doc.incarnation, "reason": reason}
        if by:
            payload["by"] = by
        event = tx.append("document/retired", payload)
        doc.retired_seq = event.seq
        doc.save(update_fields=["retired_seq"])
    return doc.incarnation


def retire_task(session_id: uuid.UUID, task: str, *, fence: log.Fence | None = None) -> list[str]:
    """Retire every live document of `task` (its terminal receipt calls
    this); the names retired."""
    names = list(
        Document.objects.filter(session_id=session_id, scope="task", task=task, retired_seq__isnull=True)
        .order_by("name")
        .values_list("name", flat=True)
    )
    for name in names:
        retire(session_id, name, reason="task_ended", fence=fence)
    return names


# ---------------------------------------------------------------- forks


def copy_for_fork(parent: uuid.UUID, child: uuid.UUID, *, at_seq: int, policy: str, row_seq: int) -> int:
    """Give the fork `child` its documents, inside the fork's transaction
    (under the parent's row lock): conversation documents as of `at_seq`
    (historical) or as they stand (current, the parent's head `row_seq`
    read under that lock), session documents as they stand for either, none
    for fresh, task documents never. Each keeps its name, kind, scope,
    schema, incarnation and version number; its one version carries the
    child's seq 1 (its session/forked). Returns how many were copied."""
    if policy == "fresh":
        return 0
    wanted: list[Info] = []
    conversation_at = at_seq if policy == "historical" else row_seq
    wanted += [i for i in listing(parent, at_seq=conversation_at) if i.scope == "conversation"]
    wanted += [i for i in listing(parent, at_seq=row_seq) if i.scope == "session"]
    # Two statements however many documents: the copy holds the parent's row lock.
    docs = Document.objects.bulk_create(
        [
            Document(
                session_id=child,
                name=info.name,
                kind=info.kind,
                scope=info.scope,
                incarnation=info.incarnation,
                schema=info.schema,
                task=info.task,
                version=info.version,
                size=info.size,
                created_seq=1,
            )
            for info in wanted
        ]
    )
    DocumentVersion.objects.bulk_create(
        [
            DocumentVersion(
                document=doc,
                version=info.version,
                seq=1,
                content_id=info.sha256,
                size=info.size,
                schema_version=info.schema_version,
                by="fork",
            )
            for doc, info in zip(docs, wanted, strict=True)
        ]
    )
    return len(wanted)


# ---------------------------------------------------------------- the tools' backend


def fence_of(gen: int) -> log.Fence | None:
    """A tool call's lease generation as a fence (0: outside a turn, none)."""
    if not gen:
        return None
    return log.Fence(gen, float(getattr(settings, "TERRET_LEASE_SECONDS", TTL_FALLBACK)))


class ToolBackend:
    """What the workspace.* tools reach through tools/documents.py."""

    def read(self, session_id: uuid.UUID, name: str) -> bytes | None:
        try:
            return read(session_id, name).data
        except UnknownDocument:
            return None

    def write(self, session_id: uuid.UUID, name: str, data: bytes, *, fence: int, call_id: str) -> str:
        return write(session_id, name, data, by="agent", fence=fence_of(fence), call_id=call_id).name

    def list(self, session_id: uuid.UUID, limit: int) -> list[tuple[str, int]]:
        return [(i.name, i.size) for i in listing(session_id, limit=limit)]

    def digest(self, session_id: uuid.UUID, name: str) -> str | None:
        return head_digest(session_id, name)


def register_tools() -> None:
    tool_documents.register(ToolBackend())
