from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_save


class SessionsAppConfig(AppConfig):
    name = "sessions_app"
    label = "sessions_app"
    verbose_name = "Sessions and agents"

    def ready(self) -> None:
        # Imported here, not at the top: Django imports apps.py while the app
        # registry is still loading, before any module that touches models
        # can be imported.
        from sessions_app.monitors import run as monitor_run  # local, as the ones above: models load first
        from sessions_app.runtime import codever, dispatch, documents, hooks, inprocess, materialize, versions
        from sessions_app.runtime.owned import store as owned_store  # local: see above
        from sessions_app.runtime.owned import subagent, supervise  # local: see above
        from sessions_app.services import (  # local: see above
            compaction,
            inputs,  # local: see above
            monitors,
            schedules,
        )
        from sessions_app.services.post_turn import post_turn  # local: see above

        codever.apply_test_versions()  # a test playing another release (TESTING only)
        hooks.register_after_turn(post_turn)
        hooks.register_compactor(compaction.compact_in_turn)
        schedules.register_agent_tools()
        documents.register_tools()  # workspace.* read and write the session's documents
        materialize.register_tools()  # MCP servers with "workspace": true work in a copy of them
        monitors.register_agent_tools()
        hooks.register_clock(monitor_run.tick)  # monitors' periods, on every worker's clock thread
        supervise.setup()  # task kinds, the reaper on the clock, the task tools' backend
        owned_store.use_dispatch(dispatch.start_task, dispatch.wake)
        inprocess.use_task_runner(supervise.start)
        subagent.use_stopper(inputs.cancel)  # a cancelled subagent's child gets the Stop a person has
        # Every save of a profile records a version if its definition changed.
        post_save.connect(versions.on_profile_saved, sender="sessions_app.AgentProfile", dispatch_uid="agent_versions")

        # Local for the same reason. The notifications' listener registers
        # itself with the log's fan-out on import; it is handed the sender's
        # wake-up here, since the sender (services) sits above it (plugins).
        from sessions_app.notify import delivery, listeners

        listeners.set_waker(delivery.wake)
