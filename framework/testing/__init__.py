"""For plugin authors: the controller and scorer conformance suites (:mod:`.conformance`,
:mod:`.scorer_conformance`, harness in :mod:`.controller_harness`) and designed toy denoisers with
known answers (:mod:`.toys`)."""
