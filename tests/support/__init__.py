"""Helpers shared by the tests, the only place test modules import helpers from (`from tests.support import oracle`):
independent references (oracle, mixer), statistical assertions, toy models, known-wrong verifiers."""
