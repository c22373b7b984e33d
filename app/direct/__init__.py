"""Direct Get (ADR-31): reads by sequence and subject, batches, and consistent multi-subject
reads; ``arrow`` answers batches in Arrow IPC."""
