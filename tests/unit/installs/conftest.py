from tests.fixtures.installs import live_root  # noqa: F401  (fixture)
