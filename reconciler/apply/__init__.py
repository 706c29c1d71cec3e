"""The imperative shell that changes the world: the journaled, resumable executor of plans."""
