"""Owned work: durable tasks that outlive a turn (seed 003, "Durable tasks
and owned work"; docs/protocol.md, "Tasks").

A task is a row (models.Task) and a phase machine:

    pending -> running -> completing (outcome held) -> terminal receipt
    abort requested -> signalled -> settled -> owner cleanup
    kind or version not installed -> blocked (live, visible, never dropped)

- kinds.py: the registry of installed kinds with versions; recovery resolves
  a task's (kind, version) there and blocks it when the code lacks them.
- store.py: the row's writes, each fenced on the task's generation the way a
  turn's appends are fenced on lease_gen: admission, claim and renewal, the
  held outcome, the terminal receipt (one per task, appended to the owner's
  log in the transaction that ends the row), abort intent.
- command.py: the `command` kind, a supervised process in its own group.
- supervise.py: what a worker runs for a task, and the sweep's reaper.
- waits.py: task.start and task.wait inside a turn: the turn parks in
  waiting_task (no worker, no lease) until the terminal receipts.
- audit.py: tasks_audit(session), beside effects_audit.
"""
