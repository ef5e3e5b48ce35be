"""Monitors: recurring collection with coverage that can be proven and
deliveries never missed or sent twice (issue 32; seed 003's "Recurring
collection and delivery bookkeeping": SourceScan, Edition, DeliveryLedger).

- sources/: the source kinds (feed), a registry by name and version;
- destinations/: the destination kinds (webhook, email), likewise;
- run.py: the clock's work: claim, settle, scan, decide, publish.

The host owns collection, bookkeeping and publication; the rows
(sessions_app/models.py: Monitor, MonitorCheckpoint, SourceScan,
MonitorCandidate, Edition, DeliveryLedger) are the record."""
