"""For plugin authors: the controller, scorer and task conformance suites (:mod:`.conformance`,
:mod:`.scorer_conformance`, :mod:`.task_conformance`, harness in :mod:`.controller_harness`) and
designed toy denoisers with known answers (:mod:`.toys`)."""
