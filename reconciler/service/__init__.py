"""The application layer: the reconcile pass, building it from settings, rollback and savepoint.

Below `reconciler.daemon` and `reconciler.cli`, which both call it; it imports neither.
"""
