from tests.fixtures.installs import install_stack, installer_endpoint, live_images  # noqa: F401  (fixtures)
