"""Provision jobs: the job service (:mod:`.service`) and its use cases.

:mod:`.service` (``JobService``) wires the use cases: :mod:`.worker` (the worker phase),
:mod:`.admitter` (admission loop and queue; the pure rule in :mod:`.admission`), :mod:`.callbacks`
(installer reports) and :mod:`.upkeep` (stuck sweep, leases). Each use case takes the service as
the narrow protocol of :mod:`.ports` and never imports :mod:`.service`. :mod:`.repository` is the
SQL, :mod:`.hostctx` the per-host install context. Nothing is re-exported here: importing a use
case must not import the service.
"""
